"""--optim: torch's AdamW, or bitsandbytes' 8-bit AdamW (a quarter of the state, nearly the same steps)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")


def _tiny_llama():
    """The checkpointing tests' tiny Llama, wide enough that every matrix gets 8-bit moments."""
    from tests.example_trainer.test_checkpointing import _tiny_llama as tiny

    return tiny(hidden_size=128, intermediate_size=256)


def _train(model, optimizer, steps, seed=1):
    """``steps`` next-token steps on fixed random ids; the losses."""
    gen = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 97, (4, 12), generator=gen) for _ in range(3)]
    losses = []
    for i in range(steps):
        ids = batches[i % len(batches)]
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _build(name, model, lr=3e-3):
    from example_trainer.optimizer import build_optimizer

    return build_optimizer(name, [p for p in model.parameters() if p.requires_grad], lr=lr,
                           betas=(0.9, 0.99), weight_decay=0.0)


def test_8bit_adamw_holds_a_third_of_the_state_and_takes_nearly_the_same_steps():
    pytest.importorskip("bitsandbytes")
    from example_trainer.optimizer import optimizer_state_bytes

    fp32 = _tiny_llama()
    q8 = copy.deepcopy(fp32)
    opt32, opt8 = _build("adamw_torch", fp32), _build("adamw_bnb_8bit", q8)
    losses32, losses8 = _train(fp32, opt32, 12), _train(q8, opt8, 12)
    # both learn the fixed batches, by about the same amount
    assert losses32[-1] < losses32[0] - 0.3 and losses8[-1] < losses8[0] - 0.3
    assert abs(losses8[-1] - losses32[-1]) < 0.02 * losses32[0]
    # the weights moved the same way: the 8-bit update is the fp32 one up to quantization noise
    start = dict(_tiny_llama().named_parameters())
    for (name, p32), (_, p8) in zip(fp32.named_parameters(), q8.named_parameters(), strict=True):
        if not p32.requires_grad:
            assert torch.equal(p32, p8), name
            continue
        d32, d8 = p32 - start[name], p8 - start[name]
        cos = torch.nn.functional.cosine_similarity(d32.flatten(), d8.flatten(), dim=0)
        assert cos > 0.95, (name, cos.item())
    # ... but not exactly: the moments were quantized
    assert any(not torch.equal(p32, p8) for p32, p8 in zip(fp32.parameters(), q8.parameters(), strict=True))
    # the big matrices' moments are 1 byte each (+ a scale per block), the norms' stay fp32
    moments = [s for s in opt8.state.values() if "state1" in s]
    assert moments and all(s["state1"].dtype == torch.uint8 for s in moments if s["state1"].numel() >= 4096)
    assert optimizer_state_bytes(opt8) < 0.35 * optimizer_state_bytes(opt32)


def test_8bit_adamw_resumes_from_a_checkpoint_exactly(tmp_path):
    """Saved and restored through the checkpoint code (torch.distributed's optimizer state dict)."""
    pytest.importorskip("bitsandbytes")
    from example_trainer.checkpoint import find_latest, load_training_state, save_checkpoint

    model = _tiny_llama()
    optimizer = _build("adamw_bnb_8bit", model)
    _train(model, optimizer, 3)
    save_checkpoint(tmp_path / "checkpoints" / "step_3", step=3, model=model, optimizer=optimizer,
                    write_weights=lambda d: None, lora=False)
    resumed = copy.deepcopy(model)
    resumed_opt = _build("adamw_bnb_8bit", resumed)
    assert load_training_state(resumed, resumed_opt, find_latest(tmp_path)) == 3
    for name, state in optimizer.state[next(iter(optimizer.state))].items():
        if isinstance(state, torch.Tensor):
            assert torch.equal(resumed_opt.state[next(iter(resumed_opt.state))][name], state), name
    # the next steps match those of the run that was never interrupted
    assert _train(resumed, resumed_opt, 2, seed=5) == _train(model, optimizer, 2, seed=5)
    for p, q in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q)


def test_the_config_and_the_builder_refuse_what_they_cannot_run():
    from example_trainer.config import TrainerConfig
    from example_trainer.optimizer import OPTIMIZERS, build_optimizer

    assert TrainerConfig(optim="adamw_bnb_8bit").optim == "adamw_bnb_8bit"
    assert TrainerConfig().optim == "adamw_torch" == OPTIMIZERS[0]
    with pytest.raises(ValueError):
        TrainerConfig(optim="adamw_8bit")
    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ValueError, match="not one of adamw_torch, adamw_bnb_8bit"):
        build_optimizer("sgd", params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    with pytest.raises(ValueError, match="use --optim adamw_torch there"):
        build_optimizer("adamw_bnb_8bit", params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, sharded=True)


def test_scheduled_lr_warms_up_then_holds_or_decays_to_zero():
    from example_trainer.optimizer import scheduled_lr

    assert [scheduled_lr(1.0, s, warmup_steps=4) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    assert scheduled_lr(2.0, 7, scheduler="constant", progress=0.9) == 2.0
    assert [scheduled_lr(2.0, 5, scheduler="linear", progress=p) for p in (0.0, 0.25, 1.0)] == [2.0, 1.5, 0.0]
    cosine = [scheduled_lr(2.0, 5, scheduler="cosine", progress=p) for p in (0.0, 0.5, 1.0)]
    assert cosine == pytest.approx([2.0, 1.0, 0.0])
    # warm-up and decay multiply: step 1 of 2 warm-up steps, a quarter through a linear run
    assert scheduled_lr(1.0, 1, warmup_steps=2, scheduler="linear", progress=0.25) == 0.375
    with pytest.raises(ValueError, match="not one of constant, linear, cosine"):
        scheduled_lr(1.0, 1, scheduler="exponential")


def test_schedule_progress_follows_whichever_limit_comes_first():
    from example_trainer.optimizer import schedule_progress

    assert schedule_progress(1, 20) == 0.0 and schedule_progress(6, 20) == 0.25  # steps alone
    assert schedule_progress(5, 20, elapsed_seconds=90.0, budget_seconds=100.0) == 0.9
    assert schedule_progress(16, 20, elapsed_seconds=10.0, budget_seconds=100.0) == 0.75
    assert schedule_progress(5, 20, elapsed_seconds=130.0, budget_seconds=100.0) == 1.0
    assert schedule_progress(6, 20, elapsed_seconds=90.0, budget_seconds=None) == 0.25
