"""The run's layout: one ("dp", "cp") DeviceMesh whose cp groups split a window and whose flattened dp x cp
dimension FSDP shards over (checked on 4 gloo processes against the rank arithmetic rank = dp_rank * cp +
cp_rank), and the homes of the parallel concerns (process groups made in one place, no activation checkpointing
in the model)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import lcft
from lcft.parallel import ParallelConfig, init_parallel, single_process_state
from tests.evaluate.conftest import data_dir  # noqa: F401 (fixture)
from tests.parallel.harness import run_ranks

LIB = Path(lcft.__file__).parent


def _layout_on_rank(rank: int, world: int, cp: int) -> dict:
    layout = init_parallel(ParallelConfig(cp=cp), fsdp=True)
    cp_members = torch.zeros(world, dtype=torch.int64)
    cp_members[rank] = 1
    dist.all_reduce(cp_members, group=layout.cp_group)  # which ranks answer in this rank's cp group
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shard = layout.shard_mesh()
    return {
        "warned": [str(w.message) for w in caught],
        "dims": layout.mesh.mesh_dim_names, "shape": tuple(layout.mesh.shape), "mesh": layout.mesh.mesh.tolist(),
        "ranks": (layout.dp, layout.cp, layout.dp_rank, layout.cp_rank),
        "cp_members": cp_members.nonzero().flatten().tolist(),
        "mesh_cp": layout.mesh.get_local_rank("cp"), "mesh_dp": layout.mesh.get_local_rank("dp"),
        "shard_size": shard.size(), "shard_root": shard._get_root_mesh() is layout.mesh,
        "flags": (layout.cp_enabled, layout.fsdp_enabled, layout.is_main),
    }


@pytest.mark.distributed
def test_one_mesh_gives_the_cp_groups_and_the_fsdp_shard_dimension():
    world, cp = 4, 2
    results = run_ranks(_layout_on_rank, world, cp)
    for rank, r in enumerate(results):
        dp_rank, cp_rank = divmod(rank, cp)
        assert r["dims"] == ("dp", "cp") and r["shape"] == (world // cp, cp)
        assert r["mesh"] == [[0, 1], [2, 3]]
        assert r["ranks"] == (world // cp, cp, dp_rank, cp_rank)
        assert (r["mesh_dp"], r["mesh_cp"]) == (dp_rank, cp_rank)
        assert r["cp_members"] == [dp_rank * cp + c for c in range(cp)]  # consecutive ranks share a window
        assert r["shard_size"] == world and r["shard_root"]  # FSDP: every rank, flattened from the same mesh
        # Taken as flattening made it: slicing it out of the root mesh warned of its deprecation on every rank.
        assert r["warned"] == []
        assert r["flags"] == (True, True, rank == 0)


def test_one_process_has_no_mesh_and_shards_nothing():
    layout = init_parallel(ParallelConfig(), fsdp=True)
    assert layout.mesh is None and layout.fsdp and not layout.fsdp_enabled and not layout.cp_enabled
    assert layout.is_main and (layout.world, layout.dp, layout.cp) == (1, 1, 1)
    with pytest.raises(ValueError, match="does not shard"):
        single_process_state().shard_mesh()


def _calls(name: str) -> dict[str, int]:
    """Library files calling `name(` (as a function or a method), with how many times."""
    found: dict[str, int] = {}
    for path in sorted(LIB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called == name:
                    found[str(path.relative_to(LIB))] = found.get(str(path.relative_to(LIB)), 0) + 1
    return found


def test_process_groups_and_meshes_are_made_in_one_place():
    """dp and cp groups come from the layout's one mesh; FSDP shards over a view of it, never a mesh of its
    own; no `new_group` loops anywhere else."""
    meshes = _calls("init_device_mesh")
    assert meshes == {"parallel/mesh.py": 1}, meshes
    groups = _calls("new_group")
    assert len(groups) <= 1 and sum(groups.values()) <= 1, groups


def test_the_model_holds_no_activation_checkpointing_code():
    """Checkpointing, activation offload and sequence chunks live in lcft.parallel.activations; lcft.model
    keeps only the model's math (no torch.utils.checkpoint, no save_on_cpu, no per-chunk routing)."""
    banned = {"save_on_cpu", "seq_chunk", "offload", "checkpointing", "set_activation_checkpointing"}
    for path in sorted((LIB / "model").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "torch.utils.checkpoint", f"{path.name} imports torch.utils.checkpoint"
            if isinstance(node, ast.Attribute) and node.attr == "checkpoint":
                assert getattr(node.value, "attr", None) != "utils", f"{path.name} uses torch.utils.checkpoint"
            names = ({node.id} if isinstance(node, ast.Name) else {node.attr} if isinstance(node, ast.Attribute)
                     else {node.arg} if isinstance(node, ast.arg) else
                     {node.name} if isinstance(node, ast.FunctionDef) else set())
            assert not names & banned, f"{path.name}:{node.lineno} {names & banned}"


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2"},
                                 {"WORLD_SIZE": "4", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"},
                                 {"WORLD_SIZE": "two"}])
def test_a_world_size_left_in_the_shell_is_one_line(env, data_dir, tmp_path):  # noqa: F811
    """`lcft train` without --nproc, WORLD_SIZE left set from another job: one line naming the variable and the
    fix, exit 1, no folder made; not torch.distributed's traceback, nor a wait for ranks that never come (bounded
    here by --collective-timeout)."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "lcft", "train", "--data", str(data_dir), "--out", str(out),
                        "--preset", "tiny", "--steps", "1", "--global-batch", "1", "--seq-len", "256",
                        "--collective-timeout", "5"], capture_output=True, text=True, timeout=300,
                       env={**clean, "PYTHONPATH": str(LIB.parent), **env})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: WORLD_SIZE="), r.stderr[-3000:]
    assert "--nproc" in lines[0] and not out.exists()
