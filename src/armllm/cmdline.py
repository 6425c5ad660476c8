"""cmdline: what every armllm subcommand shares, in a module that imports
nothing of armllm above it: the UsageError a bad command-line value raises
(reported in one line, exit code 2), the MODEL argument with its default,
the demo model, and the progress bar commands draw on stderr."""
from __future__ import annotations

import argparse
import sys

from armllm import demo_model

MODEL_HELP = ("a Hugging Face model directory, a .gguf file, or a Hugging Face Hub model "
              "downloaded on first use: ORG/NAME[@REVISION] (safetensors), "
              "ORG/NAME[@REVISION]:QUANT or ORG/NAME/FILE.gguf (one GGUF file); a local "
              f"path wins (default: {demo_model.DESCRIPTION}, downloaded on first use unless "
              "installed)")


class UsageError(Exception):
    """A bad command-line value: reported in one line, exit code 2."""


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """The optional positional MODEL."""
    parser.add_argument("model", nargs="?", help=MODEL_HELP)


def resolve_model(model: str | None) -> str:
    """MODEL as given (a Hub name downloads where the model layer reads it: see
    loader.model_path), else the demo model: installed, fetched before, or fetched now."""
    if model:
        return model
    path = demo_model.locate()
    if path is None:
        print(f"armllm: fetching the default model ({demo_model.DESCRIPTION}) into "
              f"{demo_model.cache_dir()}", file=sys.stderr)
        try:
            path = demo_model.fetch()
        except demo_model.DemoModelError as exc:
            raise UsageError(str(exc)) from None
    return str(path)


def progress_bar(done: float, total: float, width: int = 30) -> str:
    """`[#########         ]`: done out of total as a bar of `width` characters."""
    filled = min(width, int(width * done / total)) if total > 0 else width
    return f"[{'#' * filled:<{width}}]"
