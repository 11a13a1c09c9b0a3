"""The CPU side of `make gpu-check`: gpu_check.py's options, table and no-GPU exit; the offline install step."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lcft.kernels

ROOT = Path(__file__).resolve().parents[1]
H200_NODE = "256GiB"  # host memory per GPU of an 8 x H200 node with 2 TiB (a one-GPU node with 128 GiB offloads bf16)
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
import gpu_check_deps  # noqa: E402
import gpu_check_plan  # noqa: E402
import gpu_check_train  # noqa: E402


def test_default_is_quick_and_full_adds_the_long_sizes():
    assert gpu_check.lengths("32K,1M,4096") == [32768, 1 << 20, 4096]
    args = gpu_check.parse_args(["--quick", "--out", "x", "--dense-max", "128K"])
    assert args.quick and args.out == Path("x") and gpu_check.lengths(args.dense_max) == [131072]
    quick, full = gpu_check.parse_args([]), gpu_check.parse_args(["--full"])
    assert gpu_check.lengths(quick.attention) == [32 * 1024, 128 * 1024] and quick.train == "128K"
    assert gpu_check.lengths(full.attention)[-1] == 1 << 20 and gpu_check.lengths(full.train) == [131072, 1 << 20]
    assert quick.plan_length == full.plan_length == "1M"


def test_the_1m_layout_is_what_lcft_plan_prints():
    from lcft.config_build import resolve
    from lcft.plan.config import PlanConfig
    from lcft.plan.plan import report

    flags, lay, est = gpu_check_plan.plan_for_one_gpu(1 << 20, H200_NODE)
    text, fits = report(resolve(PlanConfig, None, {"preset": "1b", "attention": "sparse", "seq_len": 1 << 20,
                                            "gpu_memory": gpu_check_plan.H200_MEMORY, "host_memory": H200_NODE}))
    first = text.split("it would fit with:")[1].strip().splitlines()[0]
    assert not fits and first.startswith(flags) and lay.seq_len == 1 << 20 and lay.cp == 1
    assert (lay.checkpointing, lay.offload_activations) == ("block", "--offload-activations" in flags)
    assert f"{est.total / 2**30:.2f} GiB" in first


def test_the_1m_layout_must_fit_the_nodes_host_memory():
    """The 1M plan is made for this node's host memory unless told otherwise: with too little for the offloaded block
    inputs (176 GiB: fp32 under bf16 autocast) it keeps them in bf16 (88 + 4 GiB); with less, no layout."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert gpu_check.parse_args([]).host_memory == str(gpu_check_plan.node_memory()) and gpu_check_plan.node_memory() <= physical
    assert gpu_check.parse_args(["--host-memory", "64GiB"]).host_memory == "64GiB"
    assert gpu_check.parse_args([]).gpu_memory is None  # this GPU's own (main), unless --gpu-memory says otherwise
    flags, lay, est = gpu_check_plan.plan_for_one_gpu(1 << 20, "128GiB")
    assert flags == "--checkpointing block --offload-activations --offload-bf16" and lay.offload_bf16, flags
    assert est.host == 88 * 2**30 and gpu_check_plan.plan_for_one_gpu(1 << 20, H200_NODE)[2].host == 176 * 2**30
    flags, lay, _ = gpu_check_plan.plan_for_one_gpu(1 << 20, "64GiB")
    assert flags == gpu_check_plan.NOTHING_FITS and lay.checkpointing == "none"


def test_the_step_a_128gib_node_runs_at_1m_runs_here():
    """The flags a one-GPU node with 128 GiB takes at 1M (bf16 host copies), through the function its plan step
    calls, for tiny at 512 tokens: the rehearsal's own plan step takes the exact copies."""
    row = gpu_check_train.bench_train(512, "block", True, warmup=False, device="cpu", preset="tiny", offload_bf16=True)
    assert row["finite"] and row["preset"] == "tiny" and row["peak_gib"] > 0 and row["offload"] == "bf16", row


def test_without_cuda_it_exits_2_and_writes_nothing(tmp_path, capsys):
    if torch.cuda.is_available():
        return  # the real run is `make gpu-check`
    assert gpu_check.main(["--out", str(o := tmp_path / "o")]) == 2 and "no CUDA" in capsys.readouterr().err and not o.exists()


@pytest.mark.triton
@pytest.mark.skipif(importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs triton and TRITON_INTERPRET=1 on CPU")
def test_a_cpu_rehearsal_runs_the_gpu_runs_benchmark_code(tmp_path, monkeypatch):
    """`gpu_check.py --device cpu`: the GPU run's code at small sizes (Triton interpreted, SDPA's flash, the plan's
    step in its own process, GPU tests skipped), so a renamed lcft API fails here and not in a GPU slot."""
    calls, out = [], tmp_path / "o"  # sparse attention is timed end to end, as dense is: its selection in every run
    monkeypatch.setattr(lcft.kernels, "select_blocks", lambda *a, s=lcft.kernels.select_blocks: calls.append(1) or s(*a))
    # attention at 128 tokens, one block (a rehearsal's default: 256): the same code, a third of the interpreter's time
    assert gpu_check.main(["--device", "cpu", "--repeat", "1", "--attention", "128", "--out", str(out)]) == 0
    assert len(calls) == 1 + 1 + 1  # check, warm-up, the one timed run
    res = json.loads((out / "gpu-check.json").read_text())
    tests = {c["name"].rsplit("::", 1)[-1] for c in res["tests"]["cases"] if c["outcome"] == "skipped"}
    assert res["rehearsal"] and "test_sparse_train_step_on_gpu_equals_cpu" in tests and res["tests"]["ok"]  # all skipped
    (att,), (step,) = res["attention"], res["train"]
    assert att["finite"] and att["dense"].startswith("SDPA flash") and att["sparse_ms"] > 0 and att["dense_ms"] > 0
    assert step["finite"] and step["preset"] == "tiny" and step["tokens_per_s"] > 0 and step["peak_gib"] > 0
    plan = res["plan"]  # the plan's step, in a child process as on the GPU, for tiny at 1K
    assert plan["preset"] == "tiny" and plan["length"] == 1024 and plan["fits"] and plan["finite"], plan
    assert plan["host_peak_gib"] >= plan["peak_gib"] > 0, plan
    # laid out for a GPU just too small for block checkpointing alone: the flags (and code path) of the 1M run
    assert plan["flags"] == gpu_check_plan.plan_for_one_gpu(1 << 20, H200_NODE)[0] == "--checkpointing block --offload-activations"
    md = (out / "gpu-check.md").read_text()
    assert "rehearsal only" in md and "| sparse attention f+b (Triton, bf16, block selection included) | 128 |" in md and "| tiny train step" in md and "| tiny, `lcft plan`" in md
    assert not any(ln.endswith(("| yes |", "| NO |")) for ln in md.splitlines())  # no target judged on CPU
    report = (out / "gpu-tests.xml").read_bytes()  # on a GPU a skipped GPU test is a failure: that run replayed
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda cmd, **k: (out / "gpu-tests.xml").write_bytes(report) and
                        subprocess.CompletedProcess(cmd, 0, res["tests"]["summary"] + "\n", ""))  # (it exited 0)
    assert not gpu_check.run_tests(out)["ok"] and gpu_check.run_tests(out, on_gpu=False)["ok"]


def test_the_1m_step_runs_in_its_own_process_and_its_death_is_a_row(tmp_path):
    """A step process that ends without a result (here: no CUDA, exit 2) is a row naming why, not "does not fit"
    (that is what running out of memory says)."""
    if torch.cuda.is_available():
        return  # the real run is `make gpu-check`
    row = gpu_check_plan.plan_step_in_child(1 << 20, H200_NODE)
    flags, _, est = gpu_check_plan.plan_for_one_gpu(1 << 20, H200_NODE)
    assert row["flags"] == flags and not row["fits"] and row["host_gib"] == est.host / 2**30 > 0
    assert row["error"].startswith("its process ended (exit 2)") and "no CUDA" in row["error"], row
    md = gpu_check.markdown({"device": "GPU", "attention": [], "train": [], "plan": row, "tests": {}})
    assert f"| {row['error']} | plan {row['plan_gib']:.1f} GiB (+ {row['host_gib']:.1f} GiB host + 4" in md
    assert "does not fit" not in md


def _closure(roots: list[tuple[str, str]]) -> set[str]:
    """Every distribution the (requirement, extra) roots need, as installed here, walked through their metadata;
    CUDA packages (nvidia-*, cuda-*) are named but not walked: a CUDA torch in a CPU venv runs without most of them."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = set(), list(roots)
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in seen or name == "lcft":
            continue
        seen.add(name)
        if name.startswith(("nvidia-", "cuda-")):
            continue
        todo += [(r, e) for e in [""] + sorted(req.extras) for r in importlib.metadata.requires(name) or []]
    return seen


def _needed_distributions() -> set[str]:
    """Every distribution lcft[kernels,test] needs (lcft's extras "", kernels, test, dev)."""
    return _closure([(r, extra) for extra in ("", "kernels", "test", "dev") for r in importlib.metadata.requires("lcft")])


def _constraints() -> dict[str, bool]:
    """constraints.txt: canonical name -> carried into wheelhouse/ (not marked "not carried")."""
    from packaging.utils import canonicalize_name

    lines = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln.strip() and ln[0] != "#"]
    return {canonicalize_name(ln.split("==")[0]): "not carried" not in ln for ln in lines}


def test_constraints_pin_every_installed_dependency_and_carry_no_cuda():
    pins = _constraints()
    needed = {n for n in _needed_distributions() if n != "torch" and not n.startswith(("nvidia-", "cuda-"))}
    assert needed - pins.keys() == set(), "constraints.txt misses these"
    for name in ("setuptools", "wheel", "pyfaidx", "biopython", "tokenizers", "transformers", "pytest",
                 "typing-extensions"):  # torch needs it too, but pydantic-core may need a newer one than the node's
        assert pins[name], name
    assert not any(carried for name, carried in pins.items()
                   if name in ("torch", "triton", "numpy") or name.startswith(("nvidia-", "cuda-")))


def _repo_copy(dest: Path) -> Path:
    """The files git would give a clone (tracked and not ignored), copied under dest."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


@pytest.fixture(scope="module")
def offline_node(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(tmp folder, a clone with wheelhouse/, the environment of an offline node): a stand-in nvidia-smi on PATH,
    no index, no pip config; PY = this test's python (its torch: the node's)."""
    tmp = tmp_path_factory.mktemp("node")
    repo = _repo_copy(tmp / "repo")
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    pythons = ROOT / "wheelhouse" / "pythons"
    if pythons.is_file() and py in pythons.read_text().split():  # `make wheelhouse` ran here for this Python
        shutil.copytree(ROOT / "wheelhouse", repo / "wheelhouse")
    else:  # a fresh clone, or one built for the GPU node's Python only: build it (needs the package index)
        subprocess.run(["make", "-s", "wheelhouse", f"PY={sys.executable}", f"WHEEL_PYTHONS={py}"], cwd=repo,
                       check=True)
    (tmp / "bin").mkdir()
    (smi := tmp / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in (no GPU here)'\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env |= {"PATH": f"{tmp / 'bin'}:{env['PATH']}", "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
            "PY": sys.executable}
    return tmp, repo, env


INSTALL = ["bash", "benchmarks/gpu_check.sh", "--install-only"]


@pytest.mark.slow
def test_install_only_builds_the_gpu_venv_from_the_wheelhouse_alone(offline_node):
    """`gpu_check.sh --install-only` offline (a torch below the floor; a half-made venv made again; no index: fast)."""
    tmp_path, repo, env = offline_node
    (old := tmp_path / "old-torch").mkdir()  # a torch that says 2.10.2: its version is all the script reads of it
    (old / "torch.py").write_text('__version__ = "2.10.2+cu128"\n')
    res = subprocess.run(INSTALL, cwd=repo, env=env | {"PYTHONPATH": str(old)}, capture_output=True, text=True)
    assert res.returncode == 2 and "2.10.2+cu128 here is older than" in res.stderr and not (repo / ".venv-gpu").exists()
    (repo / ".venv-gpu" / "bin").mkdir(parents=True)  # a venv an earlier run left half-made
    (repo / ".venv-gpu" / "bin" / "python").symlink_to("/bin/false")
    # the runs that stop before anything runs from the venv read only torch's version: a torch that says this one's
    # (not a second of importing the real one each); the last run imports the node's own
    (same := tmp_path / "same-torch").mkdir()
    (same / "torch.py").write_text(f'__version__ = "{torch.__version__}"\n')
    env_same = env | {"PYTHONPATH": str(same)}
    no_index = {k: v for k, v in env_same.items() if k != "PIP_NO_INDEX"} | {"PIP_INDEX_URL": "http://127.0.0.1:9/simple/"}
    res = subprocess.run(INSTALL, cwd=repo, env=no_index | {"WHEELHOUSE": "absent"}, capture_output=True, text=True)
    assert res.returncode == 1 and "no working python -m pip: making it again" in res.stderr, res.stderr
    assert "no absent/ here" in res.stderr and "does not answer in 5 s: pip tries once" in res.stderr, res.stderr
    assert "Retrying" not in res.stderr, res.stderr  # the build dependencies' own pip (setuptools) included
    (empty := tmp_path / "empty").mkdir()
    res = subprocess.run(INSTALL, cwd=repo, env=env_same | {"WHEELHOUSE": str(empty)}, capture_output=True, text=True)
    assert res.returncode == 1 and "no requirements.txt" in res.stderr
    shutil.copy2(repo / "wheelhouse" / "requirements.txt", empty)  # the pins, and no wheel to install them from
    res = subprocess.run(INSTALL, cwd=repo, env=env_same | {"WHEELHOUSE": str(empty)}, capture_output=True, text=True)
    assert res.returncode == 1 and "add its pin to constraints.txt" in res.stderr
    res = subprocess.run(INSTALL, cwd=repo, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stand-in" in res.stdout and "installed in" in res.stderr
    assert "Package would be ignored" not in res.stderr  # setuptools: the bundled sample is packaged as declared
    venv_py = repo / ".venv-gpu" / "bin" / "python"
    probe = "import lcft, pyfaidx, torch, triton, transformers; print(lcft.__file__)"
    out = subprocess.run([str(venv_py), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).is_relative_to(repo / "lcft")
    assert (repo / ".venv-gpu" / "bin" / "lcft").is_file()
    # pip compiled no bytecode (a RECORD lists each .pyc pip wrote): a short slot's time goes to the checks
    records = list((repo / ".venv-gpu" / "lib").glob("python3*/site-packages/*.dist-info/RECORD"))
    assert records and not [r for r in records if ".pyc," in r.read_text()]


@pytest.mark.slow
def test_what_neither_the_node_nor_the_wheelhouse_brings_is_named(offline_node):
    """A node python with torch, its needs and numpy only, a wheelhouse without pyfaidx's pin: exit 1 naming each
    package lcft misses; with the pin back, a missing matplotlib (lcft eval's plot only) is a note."""
    tmp_path, repo, env = offline_node
    base = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    site = next((base / "lib").glob("python3*/site-packages"))
    for name in _closure([("torch", ""), ("triton", ""), ("numpy", "")]):  # torch, triton, their needs, numpy
        if name.startswith(("nvidia-", "cuda-")):
            continue
        dist = importlib.metadata.distribution(name)
        for root in {Path(str(f)).parts[0] for f in dist.files or []} - {".."}:
            src = Path(str(dist.locate_file(root)))
            if src.exists() and not (site / root).exists():
                (site / root).symlink_to(src)
    house = tmp_path / "wheelhouse-without-pyfaidx"
    house.mkdir()
    for wheel in (repo / "wheelhouse").glob("*.whl"):
        (house / wheel.name).symlink_to(wheel)
    pins = (repo / "wheelhouse" / "requirements.txt").read_text().splitlines()
    (house / "requirements.txt").write_text("\n".join(ln for ln in pins if not ln.startswith("pyfaidx==")) + "\n")
    shutil.copy2(repo / "wheelhouse" / "pythons", house)
    venv = tmp_path / "venv-bare"
    env = env | {"PY": str(base / "bin" / "python"), "VENV": str(venv), "WHEELHOUSE": str(house)}
    res = subprocess.run(INSTALL, cwd=repo, env=env, capture_output=True, text=True)
    # the venv also sees the interpreter's own site-packages (--system-site-packages): what it cannot import is missing
    lacks = [m for m in ("pyfaidx", "matplotlib")
             if subprocess.run([venv / "bin" / "python", "-c", f"import {m}"], capture_output=True).returncode]
    if "pyfaidx" not in lacks:
        pytest.skip("this interpreter's own site-packages has pyfaidx")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "not all here" in res.stderr, res.stderr
    for m in lacks:
        assert f"requires {m}, which is not installed" in res.stderr, (m, res.stderr)
    res = subprocess.run(INSTALL, cwd=repo, env=env | {"WHEELHOUSE": str(repo / "wheelhouse")}, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    if "matplotlib" in lacks:
        assert "note: lcft" in res.stderr and "requires matplotlib" in res.stderr, res.stderr


def test_a_hung_step_or_test_run_is_a_row_not_a_lost_slot(tmp_path, monkeypatch):
    """Past its time limit, the GPU tests' or the 1M step's row is a failure naming the limit."""
    monkeypatch.setattr(gpu_check, "TESTS_TIMEOUT_S", 0.01)
    monkeypatch.setattr(gpu_check_plan, "PLAN_STEP_TIMEOUT_S", 0.01)
    tests = gpu_check.run_tests(tmp_path)
    assert not tests["ok"] and tests["summary"] == "timed out after 0.01 s" and tests["cases"] == []
    row = gpu_check_plan.plan_step_in_child(1 << 20, H200_NODE)
    assert not row["fits"] and row["error"] == "its process ran past 0.01 s and was stopped", row
    md = gpu_check.markdown({"device": "GPU", "attention": [], "train": [], "plan": row, "tests": tests})
    assert "| 0 tests | timed out after 0.01 s |" in md and "| its process ran past 0.01 s" in md


def test_host_memory_is_the_containers_limit_when_lower(tmp_path, monkeypatch):
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(gpu_check_plan, "CGROUP_LIMITS", (str(tmp_path / "absent"), str(limit)))
    for text, want in (("max\n", physical), (f"{physical // 2}\n", physical // 2), (f"{physical * 2}\n", physical)):
        limit.write_text(text)
        assert gpu_check_plan.node_memory() == want, text


def test_the_plan_is_laid_out_for_this_gpu_and_none_fitting_runs_no_step(monkeypatch):
    """Laid out for this GPU's memory (not --gpu-memory's): on an H100 no 1M layout (91.9 GiB), no step process."""
    h100 = 85_520_809_984  # what torch reports as an 80 GB H100's total memory
    monkeypatch.setattr(gpu_check_plan.subprocess, "run", lambda *a, **k: pytest.fail("a step ran"))
    row = gpu_check_plan.plan_step_in_child(1 << 20, H200_NODE, gpu_memory=str(h100))
    assert row["no_layout"].startswith("no layout fits on this GPU (79.6 GiB)") and "error" not in row, row
    md = gpu_check.markdown({"device": "H100", "attention": [], "train": [], "plan": row, "tests": {}})
    assert "| 1M | no layout fits on this GPU (79.6 GiB) and 256 GiB of host memory |" in md
    assert "| fits one 79.6 GiB GPU | NO |" in md and gpu_check_plan.gpu_memory_label("141GB") == "141 GB"
    seen, _ = {}, monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": h100}))
    monkeypatch.setattr(gpu_check, "bench_plan", lambda *a: seen.setdefault("args", a) and {})
    assert gpu_check.main(["--plan-step", "1024"]) == 0 and seen["args"][-1] == str(h100)


def test_one_failing_benchmark_is_its_row_and_the_table_is_printed(tmp_path, monkeypatch, capsys):
    """Any exception is its row's error (type, first line), the rest still run, the table printed anyway, exit 1."""
    ok = {"dense": "d", "finite": True, "sparse_ms": 1.0, "dense_ms": 1.0, "sparse_tflops": 1, "dense_tflops": 1}
    monkeypatch.setattr(gpu_check, "bench_attention", lambda n, *a: ok | {"length": n} if n == 512 else
                        (_ for _ in ()).throw(RuntimeError("Triton: out of resources\nmore")))
    monkeypatch.setattr(gpu_check, "bench_train", lambda n, **k: {}["missing"])
    monkeypatch.setattr(gpu_check, "plan_step_in_child", lambda *a, **k: 1 / 0)
    args = ["--device", "cpu", "--skip-tests", "--attention", "256,512", "--out", str(tmp_path)]
    assert gpu_check.main(args) == 1
    res = json.loads((tmp_path / "gpu-check.json").read_text())
    assert res["attention"][0]["error"] == "RuntimeError: Triton: out of resources" and res["attention"][1]["finite"]
    assert res["train"][0]["error"] == "KeyError: 'missing'" and res["plan"]["error"] == "ZeroDivisionError: division by zero"
    assert "| 256 | RuntimeError: Triton: out of resources | | | NO |" in capsys.readouterr().out
    monkeypatch.setattr(gpu_check, "measure", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(args)
    assert "# gpu-check on a CPU" in capsys.readouterr().out


def test_the_quick_run_fits_a_ten_minute_slot_and_out_goes_through_make(tmp_path, monkeypatch):
    """Install (~1 min), tests' limit, ~2 min for attention and 128K, the 1M step in what is left: 8 minutes. --out
    in GPU_CHECK_ARGS comes after the script's own and wins."""
    assert 60 + gpu_check.QUICK_BUDGET_S <= 8 * 60 and gpu_check.TESTS_TIMEOUT_S + 120 + 60 <= gpu_check.QUICK_BUDGET_S
    limits, _ = [], monkeypatch.setattr(gpu_check, "lengths", lambda text: [1024])  # one of each, each stubbed
    monkeypatch.setattr(gpu_check, "bench_attention", lambda n, *a: {"length": n, "error": "stub"})
    monkeypatch.setattr(gpu_check, "bench_train", lambda n, **k: {"length": n, "error": "stub"})
    monkeypatch.setattr(gpu_check, "plan_step_in_child", lambda *a, timeout_s: limits.append(timeout_s) or {})
    for budget in (10_000, 200, 30):
        monkeypatch.setattr(gpu_check, "QUICK_BUDGET_S", budget)
        gpu_check.main(["--device", "cpu", "--skip-tests", "--out", str(tmp_path)])
    assert limits[0] == gpu_check_plan.PLAN_STEP_TIMEOUT_S and 190 < limits[1] <= 200 and len(limits) == 2
    plan = json.loads((tmp_path / "gpu-check.json").read_text())["plan"]
    assert plan["error"].startswith("not started: ") and plan["error"].endswith(" s left of the quick run's 30 s")
    dry = subprocess.run(["make", "-n", "gpu-check", "GPU_CHECK_ARGS=--out /x/y"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert "gpu_check.sh --out /x/y" in dry and gpu_check.parse_args(["--out", "o", "--out", "/x/y"]).out == Path("/x/y")


def test_the_gpu_tests_run_without_plugins_and_never_read_a_stale_report(tmp_path, monkeypatch):
    (tmp_path / "gpu-tests.xml").write_text('<testsuite><testcase classname="old" name="test_x"/></testsuite>')
    calls, _ = [], monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda cmd, **k: calls.append(k["env"]) or
                        subprocess.CompletedProcess(cmd, 0, "1 passed\n", ""))
    tests = gpu_check.run_tests(tmp_path)
    assert tests["cases"] == [] and not tests["ok"] and not (tmp_path / "gpu-tests.xml").exists()
    assert calls[0]["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1" and calls[0]["GLOO_SOCKET_IFNAME"] == "lo"


def test_pip_check_leaves_torch_to_the_floor_check_and_names_the_rest(tmp_path):
    (tmp_path / "req.txt").write_text("pyfaidx==0.8\ntyper==0.12\n")
    report = ["lcft 0.1.0 has requirement torch>=2.11, but you have torch 2.11.0a0+git1234abc.", "lcft 0.1.0 "
              "requires pyfaidx, which is not installed.", "lcft 0.1.0 requires matplotlib, which is not installed."]
    lacking, notes = gpu_check_deps.missing(report, tmp_path / "req.txt")
    assert lacking == [report[1]] and len(notes) == 1 and "matplotlib" in notes[0]
    assert not gpu_check_deps.reachable("http://127.0.0.1:9/simple/")


def test_the_peak_of_an_h100_nvl_is_its_own():
    assert gpu_check_train.peak_bf16("NVIDIA H100 NVL") == 835e12
    assert gpu_check_train.peak_bf16("NVIDIA H100 80GB HBM3") == 989e12 and gpu_check_train.peak_bf16("cpu") is None

