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

    def register(self, reg: Registration) -> int:
        """``POST /register``: (re)configure the run; returns a fresh 128-bit uuid.

        A second registration updates the settings (batch size, step, ...) and keeps the queue
        and the envs (Atropos 0.4 silently ignored it).
        """
        again = self.core.registration is not None
        with self.core.store.transaction():
            self.core.store.set_meta("registration", reg.model_dump())
            self.core.store.set_meta("step", reg.starting_step)
            self.core.store.set_meta("last_batch", None)  # step numbering starts again
        self.core.registration = reg
        self.core.step = reg.starting_step
        self.core.last_batch = None
        self.core.changed()
        log.info(
            "trainer %s: batch_size=%d max_token_len=%d starting_step=%d num_steps=%d",
            "re-registered" if again else "registered", reg.batch_size, reg.max_token_len,
            reg.starting_step, reg.num_steps,
        )
        too_big = [g.id for g in self.core.queue.values() if g.n_seqs > reg.batch_size]
        if too_big:
            log.warning("%d queued groups are larger than batch_size=%d and can never be served",
                        len(too_big), reg.batch_size)
        return uuid.uuid4().int

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
        with self.core.store.transaction():
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
        with self.core.store.transaction():
            self.core.store.put_env(env_id, env.to_record())
        self.core.changed()
        log.info("env disconnected: id=%d name=%s", env_id, env.real_name)
        return {"status": "success"}

    def reset(self) -> None:
        """``/reset_data``: forget everything (queue, buffers, envs, registration, latest, step).

        Cursors keep increasing, so ``/observe`` readers never see an id twice.
        """
        next_id = self.core.next_id
        with self.core.store.transaction():
            self.core.store.reset()
            self.core.store.set_meta("next_id", next_id)
        self.core.load()
        log.info("reset: queue, buffers, envs and registration cleared")

