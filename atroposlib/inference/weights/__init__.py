"""How a trainer's weights reach a running vLLM: one module per transport, plus tensor selection and background pushes."""
