"""One router per resource of the inference node: status, weights, nccl."""
