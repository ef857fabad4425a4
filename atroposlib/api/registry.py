"""Registry: the trainer's registration and the environments' (register, disconnect, reset)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from atroposlib.api.core import EnvRecord, StateCore
from atroposlib.api.models import RegisterEnv, Registration
from atroposlib.api.packing import batch_size_problem

log = logging.getLogger("atroposlib.api")


class Registry:
    """``/register``, ``/register-env``, ``/disconnect-env`` and ``/reset_data`` on a :class:`StateCore`."""

    def __init__(self, core: StateCore):
        """Work on ``core`` (shared with the other parts of the state)."""
        self.core = core

    def register(self, reg: Registration) -> dict[str, Any]:
        """``POST /register``: (re)configure the run.

        The first registration sets the step to ``starting_step``. A later one (a trainer that
        restarted, possibly from a checkpoint) updates the settings (batch size, limits, ...) and
        keeps the queue and the envs. If its ``starting_step`` is at most the server's step, it
        is a resume: the step and the kept batches stay as they are, so the trainer can fetch
        the batches of steps ``starting_step + 1`` .. ``current_step`` again with
        ``GET /batch?step=N`` and every served group still reaches the weights once. A
        ``starting_step`` past the server's step (a server without ``--db`` that lost its
        state) sets the step to it and forgets the kept batches.

        Returns:
            ``{"uuid": <fresh 128-bit int>, "current_step": step, "oldest_replayable_step":
            oldest step GET /batch?step=N can answer again, or None}``.
        """
        core = self.core
        again = core.registration is not None
        resume = again and reg.starting_step <= core.step
        core.registration = reg
        dropped = list(core.batches) if not resume else list(core.batches)[:-core.replay_batches]
        with core.transaction("storing the registration"):
            core.store.set_meta("registration", reg.model_dump())
            if not resume:
                core.store.set_meta("step", reg.starting_step)
            core.store.set_meta("last_batch", None)  # schema 2's one kept batch: now a table
            core.store.delete_batches(dropped)
        for step in dropped:
            del core.batches[step]
        if not resume:
            core.step = reg.starting_step
        core.changed()
        log.info(
            "trainer %s: batch_size=%d max_token_len=%d vocab_size=%s starting_step=%d "
            "num_steps=%d", "re-registered" if again else "registered", reg.batch_size,
            reg.max_token_len, reg.vocab_size, reg.starting_step, reg.num_steps,
        )
        oldest = core.oldest_replayable_step
        if resume and reg.starting_step < core.step:
            log.warning("trainer resumes after step %d; run-api is at step %d: the batches of "
                        "steps %d..%d can be fetched again (oldest kept: %s)", reg.starting_step,
                        core.step, reg.starting_step + 1, core.step, oldest)
            if oldest is None or oldest > reg.starting_step + 1:
                lost_to = core.step if oldest is None else oldest - 1
                log.warning("the batches of steps %d..%d are no longer kept (--replay-batches "
                            "%d): their groups will not reach the weights", reg.starting_step + 1,
                            lost_to, core.replay_batches)
        too_big = [g.id for g in core.queue.values() if g.n_seqs > reg.batch_size]
        if too_big:
            log.warning("%d queued groups are larger than batch_size=%d and can never be served",
                        len(too_big), reg.batch_size)
        return {"uuid": uuid.uuid4().int, "current_step": core.step,
                "oldest_replayable_step": oldest}

    def register_env(self, req: RegisterEnv) -> dict[str, Any]:
        """``POST /register-env``: add an env once the trainer has polled ``/batch``."""
        if not self.core.started or self.core.registration is None:
            return {"status": "wait for trainer to start"}
        k = sum(1 for e in self.core.envs if e.desired_name == req.desired_name)
        env = EnvRecord(
            registered_id=len(self.core.envs), desired_name=req.desired_name,
            real_name=f"{req.desired_name}_{k}", max_seq_len=req.max_token_length,
            weight=req.weight, group_size=req.group_size,
            min_batch_allocation=req.min_batch_allocation,
        )
        with self.core.transaction("registering the env"):
            self.core.store.put_env(env.registered_id, env.to_record())
        self.core.envs.append(env)
        self.core.changed()
        log.info("env registered: id=%d name=%s group_size=%d weight=%g min_batch_allocation=%s",
                 env.registered_id, env.real_name, env.group_size, env.weight,
                 env.min_batch_allocation)
        reg = self.core.registration
        problem = batch_size_problem(reg.batch_size, [e.group_size for e in self.core.envs])
        if problem is not None:
            log.warning("env %s registered, but %s", env.real_name, problem)
        return {
            "status": "success", "env_id": env.registered_id, "wandb_name": env.real_name,
            "checkpoint_dir": reg.checkpoint_dir, "starting_step": self.core.step,
            "checkpoint_interval": reg.save_checkpoint_interval, "num_steps": reg.num_steps,
        }

    def disconnect_env(self, env_id: int) -> dict[str, Any]:
        """``POST /disconnect-env``: the env stops counting for weights and minimums."""
        env = self.core.env(env_id)
        env.connected = False
        with self.core.transaction("disconnecting the env"):
            self.core.store.put_env(env_id, env.to_record())
        self.core.changed()
        log.info("env disconnected: id=%d name=%s", env_id, env.real_name)
        return {"status": "success"}

    def reset(self) -> None:
        """``/reset_data``: forget everything (queue, buffers, envs, registration, latest, step).

        Cursors keep increasing, so ``/observe`` readers never see an id twice.
        """
        next_id = self.core.next_id
        with self.core.transaction("resetting"):
            self.core.store.reset()
            self.core.store.set_meta("next_id", next_id)
        self.core.load()
        log.info("reset: queue, buffers, envs and registration cleared")

