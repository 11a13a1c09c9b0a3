"""`evaluate(cfg)`: per-token held-out loss through each checkpoint, reduced by position, written as a report."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from lcft import __version__
from lcft.checkpoint.layout import Identity, names_run
from lcft.config_toml import to_dict
from lcft.console import make_console, say_on_stderr, text_column, time_left_column
from lcft.errors import RESUME, LcftError
from lcft.evaluate.binning import bin_edges
from lcft.evaluate.checkpoints import CheckpointInfo, load_model, prepare_checkpoints
from lcft.evaluate.config import PROBE_OPTIONS, EvalConfig
from lcft.evaluate.inputs import open_split
from lcft.evaluate.losses import Interrupted
from lcft.evaluate.parallel import EvalParallel
from lcft.evaluate.probe import CopyProbe, default_distances, make_probe, run_probe
from lcft.evaluate.report import JSON_NAME, read_back_problem
from lcft.evaluate.split import CheckpointResult, check_finite, position_length, run_checkpoint
from lcft.evaluate.store import FORMAT, PARTIAL, LossStore, clear, discarded, pass_key
from lcft.files import read_json
from lcft.folder_lock import folder_lock
from lcft.genomics.shards import windows_identity
from lcft.kernels.triton_tiles import check_model_kernels_fit
from lcft.liveness import launch_world, launched
from lcft.parallel.config import SPLIT_OPTIONS, ParallelConfig
from lcft.parallel.same_run import checkpoint_identity, content_identity, fingerprint
from lcft.signals import Ended, StopSignals, signal_fields


def _device(name: str) -> torch.device:
    """--device (its spelling checked by EvalConfig) as a torch device, made current when a GPU, since Triton and
    NCCL work on the current device: under a launch each rank's own (`_rank_device`)."""
    dev = _rank_device(name, int(os.environ.get("LOCAL_RANK", "0")) if launched() else None)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def _rank_device(name: str, local: int | None) -> torch.device:
    """--device as a torch device, checked, not made current (set_device would give the caller, a launcher too, a
    CUDA context): for the rank of local rank `local` of a launch, its own GPU (cuda:LOCAL_RANK); `local` None: the
    only process."""
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if dev.type == "cpu":
        return dev
    if not torch.cuda.is_available():
        raise LcftError(f"device {name} asked for, but CUDA is not available")
    if local is not None:
        if dev.index is not None and dev.index != local:
            raise LcftError(f"--device {name} under a launch: each rank evaluates on its own GPU (cuda:LOCAL_RANK); "
                            "give --device cuda or auto")
        dev = torch.device("cuda", local)
    if (dev.index or 0) >= torch.cuda.device_count():
        raise LcftError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    return dev


def evaluate(cfg: EvalConfig, *, progress: bool = False, reuse: bool = True) -> dict[str, Any]:
    """Evaluate every checkpoint on the split, write eval.json, loss_by_position.csv/.png and eval.toml into
    `cfg.out` (nothing is written when an input is bad; an evaluation stopped midway, killed or by an error such
    as a diverged checkpoint, leaves the losses it computed in `cfg.out`/.partial for a rerun), and return the
    report (the content of eval.json; that of the report already in `cfg.out`, with "already": True and nothing
    computed, when it is of the same inputs and this is the only process: `_finished`; not with `reuse` False, when
    a caller found it unfit to keep); stopped by SIGTERM/SIGINT after a batch, a summary instead
    ("stopped": "signal", "signal", "signal_number", "out", "note"; lcft.signals.exit_code gives 128 + N).
    With `progress`, shows a progress bar over windows (print the table with terminal.print_table)."""
    from lcft.evaluate.report import build_report, write_outputs

    if cfg.multiprocess and not launched():
        raise ValueError("cfg asks for several processes (nproc, nnodes or max_restarts): run it through "
                         "lcft.launch.run('eval', cfg), which starts them")
    launch_world()  # a launch environment no launcher made (left in the shell, mpirun's): refused before any read
    ws = open_split(cfg)
    tokenizer = ws.manifest.get("tokenizer", {})
    n_windows = cfg.windows_of(len(ws))
    if not launched() or os.environ.get("RANK") == "0":  # said once: by a launch's rank 0
        for line in cfg.capped(len(ws)):
            say_on_stderr(line)
    planting = _planting(cfg, ws, n_windows)  # the probe's sizes checked before any checkpoint is read
    infos = prepare_checkpoints(cfg, ws.length, tokenizer)
    device = _device(cfg.device)
    if reuse and cfg.cp == 1 and not launched() and (
            done := _finished(cfg, ws, n_windows, infos, device, planting, whole_windows=False)) is not None:
        return done  # (a launch's launcher decides it before any rank starts: `finished_before_launch`)
    edges = bin_edges(position_length(ws, cfg.position), cfg.bins, cfg.bin_scale)
    parallel, lock = None, contextlib.ExitStack()
    try:
        if cfg.cp > 1 or launched():  # several ranks: windows sharded over cp, batches split over dp
            pcfg = ParallelConfig(cp=cfg.cp, cp_layout=cfg.cp_layout, cp_kv=cfg.cp_kv, collective_timeout=cfg.collective_timeout)
            parallel = EvalParallel(pcfg, device, lambda: _same_run(cfg, ws, n_windows, device))
            for info in infos:
                parallel.check(ws.length, info.block_size(), [info.max_context])
            progress = progress and parallel.is_main
        main = parallel is None or parallel.is_main
        if main:
            lock.enter_context(folder_lock(cfg.out, "lcft eval"))  # one writer per output folder
        stop = lock.enter_context(StopSignals(say_on_stderr if main else None, "keeping this batch's losses, then stopping"))
        if main:
            _say_discarded(cfg, ws, n_windows, infos, device, parallel, planting)
            if reuse:  # (the demo's reports are its own)
                _say_replaced(cfg.out)
        try:
            results = _run_all(cfg, ws, n_windows, infos, device, parallel, progress, stop, planting)
        except Interrupted as e:
            return _stopped(cfg, e.signum)
        report = build_report(cfg, ws, n_windows, infos, results, edges)
        # of the weights read (a run's latest may have moved)
        report["inputs"] = _inputs_key(cfg, ws, infos, device, planting, whole_windows=parallel is not None)
        if parallel is None or parallel.is_main:
            write_outputs(report, Path(cfg.out), cfg)
            clear(cfg.out, say_on_stderr)
    finally:
        lock.close()
        if parallel is not None:  # after an error too: left to interpreter exit, gloo can abort the process
            parallel.close()
    return report


def _same_run(cfg: EvalConfig, ws: Any, n_windows: int, device: torch.device) -> dict[str, str]:
    """This rank's fingerprint of the evaluation (lcft.parallel.same_run): its options as the evaluation takes them,
    so that one evaluation given two ways is one fingerprint (the kind of --device; each checkpoint's
    --max-context; the `n_windows` evaluated; the copy probe's distances and windows as it takes them, its options
    left out without it; the window split's without cp), and what its split's windows and checkpoints hold."""
    options = to_dict(cfg) | {"device": device.type, "max_windows": n_windows,
                              "max_context": [cfg.context_of(i) for i in range(len(cfg.checkpoints))]}
    if cfg.probe == "none":
        options = {k: v for k, v in options.items() if k not in PROBE_OPTIONS}
    else:
        options |= {"probe_windows": min(cfg.probe_windows or n_windows, n_windows), "probe_distances":
                    list(cfg.probe_distances or default_distances(ws.length, cfg.probe_segment))}
    if cfg.cp == 1:
        options = {k: v for k, v in options.items() if k not in SPLIT_OPTIONS}
    return fingerprint(options, {"data": content_identity(lambda: windows_identity(ws.manifest, cfg.split)),
                                 "checkpoints": " ".join(map(checkpoint_identity, cfg.checkpoints))})


def _planting(cfg: EvalConfig, ws: Any, n_windows: int) -> str | None:
    """The run's copy probe's `CopyProbe.planting` (None without --probe), computed once a run: the kept probe
    losses and the report's inputs are keyed on it."""
    probe = make_probe(cfg, ws, n_windows)
    return None if probe is None else probe.planting()


def _inputs_key(cfg: EvalConfig, ws: Any, infos: list[CheckpointInfo], device: torch.device, planting: str | None,
                *, whole_windows: bool) -> str:
    """What the whole report's losses depend on, as the kept passes are keyed: each entry's weights digest,
    configs, data files, options, versions and device kind (`_identity`), and with a copy probe its planted windows
    (`planting`, as its kept losses are keyed) and whether it ran whole windows (several ranks do, where one
    process runs only the pieces its target depends on: `run_probe`)."""
    key: dict[str, Any] = {"format": FORMAT, "entries": [_identity(cfg, ws, info, device) for info in infos]}
    if planting is not None:
        key |= {"probe_whole_windows": whole_windows, "planting": planting}
    return pass_key(key)


def finished_before_launch(cfg: EvalConfig, ws: Any) -> dict[str, Any] | None:
    """For a launch on one node, in its launcher before any rank starts (`ws`: the split it opened): what
    `evaluate` returns when `cfg.out` holds a finished report of these inputs (`_finished`), so no rank starts;
    else None. The device kind is rank 0's, the rank that writes the report: the first GPU this node's ranks see
    (cuda:0 under the same CUDA_VISIBLE_DEVICES), or the CPU. (Across nodes every launcher would have to know it
    before the rendezvous: there the ranks evaluate again.) Every rank's --device is checked first, as the ranks
    would: a launch they would refuse (cuda:0 for two ranks, more ranks than GPUs) is refused here too."""
    devices = [_rank_device(cfg.device, local) for local in range(cfg.nproc)]
    infos = prepare_checkpoints(cfg, ws.length, ws.manifest.get("tokenizer", {}))
    n_windows = cfg.windows_of(len(ws))
    return _finished(cfg, ws, n_windows, infos, devices[0], _planting(cfg, ws, n_windows), whole_windows=True)


def _finished(cfg: EvalConfig, ws: Any, n_windows: int, infos: list[CheckpointInfo], device: torch.device,
              planting: str | None, *, whole_windows: bool) -> dict[str, Any] | None:
    """The report in `cfg.out` marked "already" when it is a finished evaluation of these inputs (the same options
    but those no figure depends on, NOT_FIGURES: its own options, the launch's and folder's, stay those of the run
    that computed it; and `_inputs_key`, with `whole_windows` as this run's probe would: the same weights by
    content, data and device kind), so a rerun loads no model; else None (none there, unreadable, or of other
    inputs: evaluated again, and the report replaced)."""
    path = Path(cfg.out) / JSON_NAME
    if not path.is_file():
        return None
    try:
        report = read_json(path)
    except LcftError:  # cut or garbled: evaluated again
        return None
    if read_back_problem(report, cfg, n_windows) or \
            report.get("inputs") != _inputs_key(cfg, ws, infos, device, planting, whole_windows=whole_windows):
        return None
    return {**report, "already": True}


def _stopped(cfg: EvalConfig, signum: int) -> dict[str, Any]:
    """The summary of an evaluation a signal stopped (its exit code 128 + signum: lcft.signals.exit_code)."""
    fields = signal_fields(signum)
    name = fields["signal"]
    return {"stopped": Ended.SIGNAL, **fields, "out": str(cfg.out),
            "note": f"stopped by {name}: the losses computed so far are kept in {Path(cfg.out) / PARTIAL}; {RESUME}"}


@contextlib.contextmanager
def progress_bar(show: bool) -> Iterator[Any]:
    """A rich progress bar over windows (one task per checkpoint) on stderr, as prepare's, so that stdout holds
    only the report (`lcft eval ... > table.txt`), or None when not shown."""
    if not show:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    with Progress(text_column("{task.description}", "bold"), BarColumn(), MofNCompleteColumn(),
                  text_column("windows"), time_left_column(), console=make_console(stderr=True),
                  transient=False) as progress:
        yield progress


def _grouped(infos: list[CheckpointInfo]) -> list[int]:
    """Indices of `infos` with the entries of one checkpoint path together (paths in order of first listing, each
    path's entries in listed order): a checkpoint listed more than once (e.g. with and without --max-context,
    or A, B, A) is then loaded once, with one model in memory at a time."""
    first: dict[Path, int] = {}
    for k, info in enumerate(infos):
        first.setdefault(info.path, k)
    return sorted(range(len(infos)), key=lambda k: first[infos[k].path])  # stable: listed order within a path


def _run_all(cfg: EvalConfig, ws: Any, n_windows: int, infos: list[CheckpointInfo], device: torch.device,
             parallel: EvalParallel | None, progress: bool, stop: StopSignals,
             planting: str | None) -> list[CheckpointResult]:
    """Every checkpoint over the split under one progress bar, each distinct path loaded once (`planting`: the
    run's copy probe's, `_planting`); the results in the order of `infos`."""
    results: dict[int, CheckpointResult] = {}
    ran: dict[Path, str] = {}  # the file of each pass this run computed or read back -> its entry's label
    loaded: tuple[Path, Identity] | None = None
    model: torch.nn.Module | None = None
    with progress_bar(progress) as bar:
        for k in _grouped(infos):
            info = infos[k]
            if model is None or loaded != (info.path, info.identity):
                model = None  # free the previous model before loading the next
                model = _load(info, infos, device)
                loaded = info.path, info.identity
                check_model_kernels_fit(model.config, device, cfg.precision)  # before any window
                if parallel is not None:
                    parallel.prepare(model)
            results[k] = _run_one(cfg, ws, n_windows, info, model, device, parallel, bar, stop, ran, planting)
    return [results[k] for k in range(len(infos))]


def _load(info: CheckpointInfo, infos: list[CheckpointInfo], device: torch.device) -> torch.nn.Module:
    """The model of `info`. Where it names a run folder whose latest the run pruned since it was checked, `info`
    now records the run's new latest (load_model), and so do the other entries naming a run that were resolved to
    the same checkpoint: entries of one run (say with and without --max-context) evaluate the same weights."""
    first = info.path, info.identity
    model = load_model(info, device)
    if (info.path, info.identity) != first:
        for other in infos:
            if other is not info and (other.path, other.identity) == first and names_run(other.given):
                other.reads_as(info)
    return model


def _run_one(cfg: EvalConfig, ws: Any, n_windows: int, info: CheckpointInfo, model: torch.nn.Module,
             device: torch.device, parallel: EvalParallel | None, bar: Any, stop: StopSignals,
             ran: dict[Path, str], planting: str | None) -> CheckpointResult:
    """One listed checkpoint over the split, then its copy probe (with --probe copy), each a progress bar task;
    the main rank keeps each pass's losses in the output folder until the report is written (`ran`: the passes
    of earlier entries, whose losses an entry of the same weights and options reads back)."""
    probe = make_probe(cfg, ws, n_windows)
    (windows, length), *probing = _passes(cfg, ws, info, device, probe, parallel, planting)
    store = _store(cfg, windows, length, parallel)
    result = run_checkpoint(model, ws, n_windows, cfg, info.max_context, device,
                            _task(bar, info.label, n_windows, store, cfg.batch_size, _first(ran, store, info.label)),
                            parallel, store, stop)
    check_finite(info.label, result.windows)  # before its probe runs
    if probe is not None:
        ((planted, segment),) = probing
        store = _store(cfg, planted, segment, parallel)
        run_probe(model, probe, cfg, info.max_context, device,
                  _task(bar, f"{info.label}: copy probe", len(probe), store, cfg.batch_size,
                        _first(ran, store, info.label)),
                  parallel, store, stop)
        result.probe = probe.checked(info.label)
    return result


def _passes(cfg: EvalConfig, ws: Any, info: CheckpointInfo, device: torch.device, probe: CopyProbe | None,
            parallel: EvalParallel | None, planting: str | None) -> list[tuple[dict[str, Any], int]]:
    """The passes of one listed checkpoint as their losses are kept, (identity, tokens kept an item) each: its
    windows, then with a copy `probe` (`planting`: the run's, `_planting`) its planted windows' targets."""
    same = _identity(cfg, ws, info, device)
    passes = [(same | {"pass": "windows"}, ws.length)]
    if probe is not None:
        planted = {"segment": probe.segment, "distances": probe.distances, "mutation": probe.mutation,
                   "seed": probe.seed, "whole_windows": parallel is not None, "planting": planting}
        passes.append((same | {"pass": {"probe": planted}}, probe.segment))
    return passes


def _say_discarded(cfg: EvalConfig, ws: Any, n_windows: int, infos: list[CheckpointInfo], device: torch.device,
                   parallel: EvalParallel | None, planting: str | None) -> None:
    """Say once, before any pass, which kept passes in `cfg.out` this run reads none of, and why
    (`store.discarded`): a stopped run's losses silently computed again would look like a resume that failed."""
    probe = make_probe(cfg, ws, n_windows)
    passes = [LossStore(cfg.out, identity, keep) for info in infos
              for identity, keep in _passes(cfg, ws, info, device, probe, parallel, planting)]
    if (line := discarded(cfg.out, passes)) is not None:
        say_on_stderr(line)


def _say_replaced(out: str) -> None:
    """Say once, before any pass, that `out` holds an earlier evaluation's report, which this one's replaces when it
    ends (another checkpoint evaluated into the default --out): a stop now keeps it."""
    try:
        report = read_json(Path(out) / JSON_NAME)
        labels = [str(ck["label"]) for ck in report["checkpoints"]]
    except (LcftError, KeyError, TypeError):  # none there, or not a report lcft can read back: nothing to lose
        return
    say_on_stderr(f"{out} holds an earlier evaluation's report ({', '.join(labels[:4])}{', ...' * (len(labels) > 4)}): "
         "this evaluation replaces it when it ends; stop it now and choose another --out to keep that one")


def _identity(cfg: EvalConfig, ws: Any, info: CheckpointInfo, device: torch.device) -> dict[str, Any]:
    """What a checkpoint's per-token losses depend on: its weights and configs, the split's token files, the options
    and versions of the computation, and the device's kind (a GPU's model, a CPU's vector extensions), whose kernels
    may round otherwise; a kept pass of other values is not read. (Thread counts are left out: a rerun with others
    may differ in the last bits.)"""
    return {"lcft": __version__, "torch": torch.__version__, "device": [device.type, device_kind(device)],
            "weights": info.sha256, "config": info.config, "meta": info.lcft, "max_context": info.max_context, "precision": cfg.precision,
            "batch_size": cfg.batch_size, "cp": [cfg.cp, cfg.cp_layout, cfg.cp_kv], "split": cfg.split,
            "data": ws.manifest["splits"][cfg.split]["files"], "length": ws.length}


def device_kind(device: torch.device) -> str:
    """What a device's kernels round by: a GPU's model name, a CPU's vector extensions. A launcher asks it for the
    ranks' first GPU before they start (`finished_before_launch`): the name is read from the device's properties,
    which initialise CUDA but create no context on the GPU (that would hold its memory for the whole launch)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else torch.backends.cpu.get_cpu_capability()


def _store(cfg: EvalConfig, identity: dict[str, Any], keep: int, parallel: EvalParallel | None) -> LossStore | None:
    """The main rank's store of one pass (the other ranks receive what it reads back)."""
    return LossStore(cfg.out, identity, keep) if parallel is None or parallel.is_main else None


def _first(ran: dict[Path, str], store: LossStore | None, label: str) -> str | None:
    """The label of an earlier entry of this run whose pass is `store`'s (a checkpoint listed twice under the same
    options), else None; `ran` records this entry's pass."""
    if store is None:
        return None
    earlier = ran.get(store.path)
    ran.setdefault(store.path, label)
    return earlier


def _task(bar: Any, name: str, total: int, store: LossStore | None, batch: int, earlier: str | None) -> Any:
    """`advance` of a new progress bar task over `total` items (None without a bar), after saying where a
    stopped run's kept items take it up, or which `earlier` entry's losses it reuses (on the bar's console, else
    on stderr: a launch's rank 0 has no bar)."""
    kept = store.resume_at(total, batch) if store is not None else 0
    if kept:
        say = (f"{name}: the same weights and options as {earlier}: its losses reused" if earlier else
               f"{name}: resuming, {kept:,} of {total:,} read back from an interrupted run")
        if bar is not None:
            bar.console.print(say)
        else:
            say_on_stderr(say)
    if bar is None:
        return None
    task = bar.add_task(name, total=total)
    return lambda k: bar.advance(task, k)
