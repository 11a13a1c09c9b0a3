"""`lcft export CHECKPOINT --out DIR`: a checkpoint (or a run's latest one) as a transformers-loadable folder."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from lcft.cli.common import console, user_errors
from lcft.config import check_choice
from lcft.config_build import home

Dtype = Literal["float32", "bfloat16", "float16"]  # what --dtype casts the weights to (torch's names)


def register(app: typer.Typer) -> None:
    @app.command("export")
    @user_errors
    def export(
        checkpoint: str = typer.Argument(..., metavar="CHECKPOINT", help="A checkpoint folder, a run folder (its latest "
                                          "checkpoints/step-* is used), or an HF model folder or Hub id "
                                          "ORG/NAME\\[@REVISION]."),
        out: Path = typer.Option(..., "--out", "-o", help="Folder to write config.json, model.safetensors, "
                                 "lcft.json, the tokenizer files and the model's generation_config.json (where it "
                                 "has one) to (transformers loads it as the model's own class: Llama, Mistral, "
                                 "Qwen2, Qwen3 or Mixtral)."),
        dtype: str | None = typer.Option(None, "--dtype", help="Cast weights: float32, bfloat16 or float16 "
                                         "(default: as stored)."),
        force: bool = typer.Option(False, "--force", help="Overwrite the model files in a non-empty --out."),
    ) -> None:
        """Export a trained model as a Hugging Face folder of its own class (Llama, Mistral, Qwen2, Qwen3, Mixtral)."""
        from lcft.checkpoint.export_out import check_export_out, export_origin
        from lcft.checkpoint.layout import read_checkpoint, read_model_meta

        # as given: a Path would turn ./org/name into org/name, a Hub id; `--out=~/x`: the shell leaves '~'
        checkpoint, out = home(checkpoint), Path(home(str(out)))
        if dtype is not None:
            check_choice(dtype, Dtype, "--dtype")

        def export_from(source: Path) -> Path:  # source verified: a corrupt checkpoint is an error naming the file
            # before the checkpoint is read: a complete export in --out is this one (its lcft.json records the
            # source's content and --dtype), nothing to write, or another, refused
            written = False
            if not check_export_out(out, source, force, lambda: export_origin(source, dtype)):
                import torch  # after the checks: a user error answers without it

                from lcft.checkpoint.export import export_model
                from lcft.checkpoint.reader import load

                cast = getattr(torch, dtype) if dtype else None
                with console.status(f"exporting {source} ..."):
                    # a sharded model stays on the meta device: streamed shard by shard, never whole in memory
                    _, written = export_model(load(source, materialize=False), out, dtype=cast, force=force)
            done = "wrote" if written else "already exported to"  # run again after a kill, or after it completed
            console.print(f"{done} {out} (from {source})", highlight=False, soft_wrap=True)  # paths unbroken
            attention = read_model_meta(out).get("attention")
            if isinstance(attention, dict) and attention.get("backend") == "sparse":  # (a dense one: torch unread)
                from lcft.checkpoint.export import transformers_attention_note

                if note := transformers_attention_note(out):
                    console.print(note, highlight=False)
            return out

        read_checkpoint(checkpoint, export_from)  # a run's latest, pruned meanwhile: the new latest
