"""The training loop: Accelerate for placement, mixed precision, accumulation and DDP; our own data order,
atomic checkpoints, metrics and signal handling (each step's loss normalisation and spike guard: global_step.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.state import AcceleratorState, GradientState

from lcft.checkpoint.hf_folder import save_model
from lcft.checkpoint.layout import RUN_CONFIG, checkpoints_dir, latest_checkpoint
from lcft.checkpoint.resume import restore_training
from lcft.checkpoint.save import checkpoint_bytes, prune, write_checkpoint
from lcft.checkpoint.state import TrainerState, write_trainer_state
from lcft.config_toml import save_resolved, to_dict
from lcft.disk import write_faults
from lcft.errors import LcftError, is_oom
from lcft.files import atomic_write
from lcft.folder_lock import folder_lock
from lcft.genomics import open_windows, verify_windows
from lcft.genomics.dataset import DataConfig, TrainSamples
from lcft.kernels.triton_tiles import check_model_kernels_fit
from lcft.liveness import launched, restarts
from lcft.parallel import ParallelizeConfig, init_parallel
from lcft.parallel.mesh import init_world
from lcft.parallel.parallelize import parallelize
from lcft.shapes import check_batch, check_seq_len
from lcft.signals import Ended, StopSignals, signal_fields
from lcft.train.config import TrainConfig, resolve_folders
from lcft.train.global_step import GlobalStep
from lcft.train.guard import SpikeGuard
from lcft.train.memory import expandable_cuda_segments, return_freed_buffers_to_os
from lcft.train.metrics import LiveView, MetricsLog
from lcft.train.model_setup import build_model, declare_context
from lcft.train.precision import choose_precision, offload_dtype
from lcft.train.run_dir import (
    METRICS,
    SUMMARY,
    check_run_dir,
    clear_saves,
    keep_resumed_model,
    open_run_dir,
    record_data,
    same_run,
)
from lcft.train.sharded import materialize_sharded, prepare
from lcft.train.step import LossModel, make_optimizer, make_scheduler, oom_message, warmup_note
from lcft.units import counted


@dataclass
class TrainHooks:
    """Callbacks into the loop for instrumentation and fault injection (not user options)."""

    perturb_loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    """(step, micro-batch loss_sum) -> the loss_sum used for backward and the spike guard."""
    before_step: Callable[[int], None] | None = None
    """Called with the step number before its first forward (e.g. to raise an out-of-memory error)."""
    during_save: Callable[[int, Path], None] | None = None
    """(step, temp checkpoint folder): called midway through writing a checkpoint, after the model files and
    before the trainer state (e.g. to kill the process there)."""


def train(cfg: TrainConfig, hooks: TrainHooks | None = None) -> dict[str, Any]:
    """Train as `cfg` says in this process (one rank of a launch, or the only one; lcft.launch.run starts
    several); returns a summary (run_dir, checkpoint, step, loss, stopped, signal, ...)."""
    cfg = resolve_folders(cfg)
    if cfg.multiprocess and not launched():
        raise ValueError("cfg asks for several processes: lcft.launch.run('train', cfg) starts them")
    trainer = Trainer(cfg, hooks or TrainHooks())
    try:
        return trainer.run()
    finally:
        trainer.close()


def _reset_accelerate() -> None:
    """Accelerate keeps process-wide singletons; a second in-process run may use other settings."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


class Trainer(GlobalStep):
    """One invocation of a run: everything is checked before anything is written."""

    def __init__(self, cfg: TrainConfig, hooks: TrainHooks) -> None:
        self.cfg, self.hooks = cfg, hooks
        self._signals = StopSignals(self._note, "saving a checkpoint after this step")
        self.view: LiveView | None = None
        self.metrics: MetricsLog | None = None
        self._lock = contextlib.ExitStack()  # the run folder's lock (rank 0), released in close()
        self._setup_processes()
        manifest = verify_windows(cfg.data)  # names the corrupt file; raises before anything is written
        windows = open_windows(cfg.data, "train")
        self.seq_len = cfg.seq_len or windows.length
        self.run_dir = Path(cfg.out)
        if self.is_main:  # rank 0 holds the run folder from before its checkpoints are read: another writer
            self._lock.enter_context(folder_lock(self.run_dir, "lcft train"))  # would save and prune them meanwhile
        try:
            self._setup(manifest, windows)
        except BaseException:  # an in-process caller gets the run folder's lock back
            self.close()
            raise

    def _setup(self, manifest: dict, windows: Any) -> None:
        """The run folder checked, the model, data, optimizer and trainer state, then the run folder started."""
        cfg = self.cfg
        # A group the elastic agent restarted after a process died continues the run from its latest verified
        # checkpoint, whatever the first start was told; every rank of the group decides alike (the count agreed).
        # A step the died group's failed save left aside is put back first (its first start checked the folder).
        put_back = lambda: clear_saves(self.run_dir, self.is_main, self._note)  # noqa: E731
        if restarted := restarts() > 0:
            put_back()
            if latest_checkpoint(self.run_dir) is not None:
                self.cfg = cfg = dataclasses.replace(cfg, resume="auto")
        self.resume_from = check_run_dir(cfg, self.run_dir, self._note, None if restarted else put_back)
        if self.resume_from is not None:  # the model is the checkpoint's: --init and --preset keep the run's values
            self.cfg = cfg = keep_resumed_model(cfg, self.resume_from, self._note)
        self._setup_model(manifest["tokenizer"], windows.length)
        data = cfg.dataset
        data_cfg = DataConfig(self.seq_len, data.seed, data.softmask_loss_weight, data.rc_augment)
        self.samples = TrainSamples(windows, data_cfg)
        if (unused := windows.length - self.samples.pieces * self.seq_len) > 0:  # a seq_len not dividing the window
            self._note(f"warning: --seq-len {self.seq_len} takes {self.samples.pieces} aligned piece(s) of each "
                       f"{windows.length}-token window; its last {unused} tokens are never trained on")
        self._setup_optimizer()
        self._restore()
        self.data_changes = record_data(self.state, manifest)  # the checkpoints record what they were trained on
        self.guard = SpikeGuard(cfg.guard, self.state.guard_history)
        self._start_run_dir()

    def _setup_processes(self) -> None:
        """This process's place in the world (data- and context-parallel ranks), accumulation and precision."""
        cfg = self.cfg
        _reset_accelerate()
        self.cpu = not torch.cuda.is_available()
        # under a launch: the process group, its timeout, the heartbeat, and every node running the same run
        init_world(cfg.launch.collective_timeout, lambda: same_run(cfg))
        ps = PartialState(cpu=self.cpu)  # joins the torchrun process group (gloo on CPU) when launched
        self.device = ps.device
        # collective: the ("dp", "cp") mesh every rank and FSDP share; one process: nothing to shard
        self.layout = init_parallel(cfg.parallel, fsdp=cfg.parallel.shard == "fsdp")
        self.world, self.rank, self.is_main = self.layout.world, self.layout.rank, self.layout.is_main
        self.accum = check_batch(cfg.global_batch, cfg.micro_batch, self.layout.dp)
        self.precision, slow = choose_precision(cfg.precision, self.cpu)  # CPU bf16 only where native
        for warning in filter(None, [slow, *cfg.parallel.idle(self.world)]):
            self._note(warning)
        self.offload_dtype = offload_dtype(cfg.offload_bf16, self.precision)  # bf16 host copies: bf16 runs only
        if cfg.tensorboard:
            try:
                importlib.import_module("torch.utils.tensorboard")
            except ImportError:
                raise LcftError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None

    def _setup_model(self, tokenizer: dict[str, Any], window: int) -> None:
        """The model to train (resumed, --init or fresh), checked against the data, and its loss model, with
        context parallelism, activation checkpointing, compile and FSDP applied (lcft.parallel.parallelize)."""
        cfg = self.cfg
        try:  # the resumed checkpoint, else --init (a run: its latest), else a fresh model
            self.model, source = build_model(cfg, tokenizer, self.resume_from,
                                             materialize=not self.layout.fsdp_enabled, note=self._note)
        except (RuntimeError, MemoryError) as e:
            if not is_oom(e):
                raise
            given = self.resume_from or cfg.init
            built = f"from {given}" if given else f"preset {cfg.preset!r}"
            raise LcftError(f"not enough memory to build the model ({built}, a vocabulary of "
                            f"{tokenizer['vocab_size']:,}); `lcft plan` with the same options shows what it "
                            "needs") from None
        self.generation = source.generation if source else None  # carried into every checkpoint, as published
        self._check_lengths(window)
        self.loss_model = LossModel(self.model, cfg.z_loss, cfg.loss_chunk)
        par = cfg.parallel
        pcfg = ParallelizeConfig(par, par.checkpointing, par.offload_activations,
                                 offload_dtype=self.offload_dtype, compile=par.compile,
                                 device=self.device, bf16_params=self.precision == "bf16",
                                 offload_params=par.offload_params)
        self.cp_runner = parallelize(self.model, self.layout, pcfg, root=self.loss_model)
        if self.layout.fsdp_enabled:  # a sharded --init is read shard by shard here, a resumed checkpoint in _restore
            materialize_sharded(self.loss_model, self.device, self.precision, cfg.offload_params,
                                None if self.resume_from else source)
        return_freed_buffers_to_os(self.seq_len)  # long windows: freed chunk buffers go back to the OS
        expandable_cuda_segments(self.seq_len)  # and CUDA's allocator grows segments in place
        check_model_kernels_fit(self.model.config, self.device,
                                self.precision)  # a tile too big for this GPU fails here, not mid-step

    def _setup_optimizer(self) -> None:
        """Accelerator (placement, mixed precision, accumulation, DDP), AdamW and its schedule."""
        cfg = self.cfg
        self.acc = Accelerator(
            cpu=self.cpu, mixed_precision="bf16" if self.precision == "bf16" else "no",
            gradient_accumulation_steps=self.accum,
            log_with="tensorboard" if cfg.tensorboard else None,
            project_dir=str(self.run_dir / "tensorboard") if cfg.tensorboard else None,
        )
        optimizer = make_optimizer(self.loss_model, cfg.optim)
        self.scheduler = make_scheduler(optimizer, cfg.optim)
        self.lm, self.opt = prepare(self.acc, self.loss_model, optimizer, self.layout)

    def _restore(self) -> None:
        """Trainer state, optimizer, schedule and RNGs of the checkpoint resumed from (a fresh state otherwise)."""
        self.state = TrainerState(world_size=self.world)
        if self.resume_from is not None:
            self.state = restore_training(self.resume_from, self.model, self.opt, self.scheduler,
                                          self.layout.fsdp_enabled)
            self.state.world_size = self.world

    def _check_lengths(self, window: int) -> None:
        attn = self.model.config.attention
        check_seq_len(self.seq_len, self.layout.cp, attn.backend == "sparse", attn.sparse.block_size, window)
        if (warning := declare_context(self.model.config, self.seq_len)) is not None:
            self._note(f"warning: {warning}")

    def _start_run_dir(self) -> None:
        cfg = self.cfg
        if self.is_main:
            resume_step = self.state.step if self.resume_from is not None else None
            resumed = None if self.resume_from is None else (self.resume_from, self.state.step)
            open_run_dir(cfg, self.run_dir, resumed, self._note, self.data_changes)
            self.metrics = MetricsLog(self.run_dir / METRICS, resume_step)
            self.view = LiveView(cfg.progress, cfg.steps, self.state.step)
            if self.resume_from is not None:
                self._note(f"resumed from {self.resume_from} (step {self.state.step}, {self.world} process(es))")
            if (note := warmup_note(cfg.optim, self.state.step, self.state.updates)) is not None:
                self._note(note)
        if cfg.tensorboard:
            hparams = {k: v for k, v in to_dict(cfg).items() if isinstance(v, int | float | str | bool)}
            self.acc.init_trackers("lcft", config=hparams)
        self.acc.wait_for_everyone()

    def _note(self, message: str) -> None:
        if self.is_main:
            (self.view.note if self.view else print)(message)

    # ---- the loop ----
    def run(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.state
        self._signals.install()
        t_start, elapsed0, done_here, stopped, signum = time.perf_counter(), st.elapsed, 0, Ended.DONE, 0
        saved_step = st.step if self.resume_from is not None else -1
        while st.step < cfg.steps:
            try:
                record = self._step()
            except (RuntimeError, MemoryError) as e:
                if is_oom(e):
                    raise LcftError(oom_message(cfg, self.seq_len, self.precision,
                                                self.model.config.attention.backend)) from None
                raise
            done_here += 1
            st.elapsed = elapsed0 + time.perf_counter() - t_start
            record["elapsed"] = round(st.elapsed, 3)
            if self.is_main:
                self.metrics.write(record)
                self.view.update(st.step, record)
            if cfg.tensorboard:
                self.acc.log({k: v for k, v in record.items() if isinstance(v, int | float)}, step=st.step)
            if "skip" in record:
                self._note(f"step {st.step}: update skipped ({_skip_text(record)})")
            if cfg.save_every and st.step % cfg.save_every == 0:
                self.save()
                saved_step = st.step
            # Asked after the save: a signal that came while it was written stops the run here, on the step just
            # saved, not after one more step and a second save. Any rank's signal stops every rank (agreed).
            signum = self._signals.agreed(lambda mine: self._max([mine])[0])
            if cfg.max_consecutive_skips and st.consecutive_skips >= cfg.max_consecutive_skips:
                # saved at this step already: not written again (a second save of a step replaces the first)
                ckpt = self.save() if saved_step != st.step else latest_checkpoint(self.run_dir)
                raise LcftError(f"{counted(st.consecutive_skips, 'skipped update')} in a row (step {st.step}: "
                                f"{_skip_text(record)}); the run stopped with a checkpoint "
                                f"at {ckpt}; lower --lr or raise --spike-sigma, then --resume auto")
            if signum and st.step < cfg.steps:  # one during the last step: the run is complete (_finish)
                stopped = Ended.SIGNAL
                break
            if (stop := cfg.stops_after()) and done_here >= stop and st.step < cfg.steps:
                stopped = Ended.STOP_AFTER
                break
        ckpt = self.save() if saved_step != st.step else latest_checkpoint(self.run_dir)
        # Asked again after the final save (a collective, as in the loop): a signal that came too late to stop the
        # run, during its last step or that save, is still reported.
        signum = signum or self._signals.agreed(lambda mine: self._max([mine])[0])
        return self._finish(ckpt, stopped, signum, record if done_here else None)

    def _finish(self, ckpt: Path | None, stopped: Ended, signum: int, last: dict[str, Any] | None) -> dict[str, Any]:
        """The invocation's summary (also summary.json), `last` the record of its last step (None: none ran here).
        A stop signal (`signum`, 0 for none) that came as the run finished leaves it "done" (exit code 0, nothing
        to resume), yet its "signal" names it: a caller that chains work after the run (the demo) stops there."""
        st, cfg = self.state, self.cfg
        summary = {
            "run_dir": str(self.run_dir), "checkpoint": str(ckpt), "step": st.step, "steps": cfg.steps,
            "loss": st.last_loss, "bits_per_base": last["bits_per_base"] if last else None,
            "skipped": st.skipped, "stopped": stopped, "elapsed": round(st.elapsed, 3), "world_size": self.world,
            "seq_len": self.seq_len, "precision": self.precision, **signal_fields(signum or None),
        }
        if self.is_main:
            with write_faults(self.run_dir / SUMMARY):
                atomic_write(self.run_dir / SUMMARY, json.dumps(summary, indent=1) + "\n")
            if stopped == Ended.SIGNAL:
                self._note(f"stopped by signal at step {st.step}; checkpoint {ckpt}; continue with --resume auto")
            elif signum:
                done = "; the run is complete, nothing to resume" if stopped == Ended.DONE else ""
                self._note(f"{summary['signal']} came as this invocation ended, at step {st.step}/{cfg.steps}{done}")
        return summary

    def save(self) -> Path:
        """Checkpoint the current step (rank 0 writes, with --shard fsdp every rank its shards; everyone waits)."""
        self.acc.wait_for_everyone()
        path, st = checkpoints_dir(self.run_dir), self.state

        def write_rest(tmp: Path) -> None:
            save_resolved(tmp / RUN_CONFIG, to_dict(self.cfg))
            optim = None if self.layout.fsdp_enabled else self.opt.state_dict()  # fsdp: sharded in dcp/
            write_trainer_state(tmp, st, optim, self.scheduler.state_dict())

        def write_model(tmp: Path) -> None:
            save_model(self.model, tmp, self.samples.windows, self.generation)

        if self.layout.fsdp_enabled:
            from lcft.checkpoint.sharded import save_sharded  # (torch.distributed.checkpoint)

            path = save_sharded(self.run_dir, st.step, self.model, self.opt, self.is_main, write_rest,
                                self.hooks.during_save, self.samples.windows, warn=self._note,
                                generation=self.generation)
        elif self.is_main:
            path = write_checkpoint(self.run_dir, st.step, write_model, write_rest, self.hooks.during_save,
                                    expected_bytes=checkpoint_bytes(self.model), warn=self._note)
        if self.is_main:
            prune(self.run_dir, self.cfg.keep_last, self._note)
        self.acc.wait_for_everyone()
        return latest_checkpoint(self.run_dir) or path

    # ---- teardown ----
    def close(self) -> None:
        self._signals.restore()
        if self.view is not None:
            self.view.close()
        if self.metrics is not None:
            self.metrics.close()
        if getattr(self, "acc", None) is not None and self.cfg.tensorboard:
            self.acc.end_training()
        self._lock.close()
        if not launched():
            _reset_accelerate()


def _skip_text(record: dict[str, Any]) -> str:
    """Why a step's update was skipped, with the figure the guard judged: the objective, named beside the logged
    loss where soft-mask weights, z-loss or a router loss make them differ."""
    loss, objective = record["loss"], record["objective"]
    same = loss == objective or (math.isnan(loss) and math.isnan(objective))
    judged = "" if same else f"objective {objective:.4g}, "
    return f"{record['skip']}, {judged}loss {loss:.4g}"
