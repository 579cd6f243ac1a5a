"""The ``lkv`` entry point.

``lkv fit|validate|test`` are LightningCLI subcommands; every other verb is a typed function run through
jsonargparse, so each accepts ``--config FILE.yaml``, ``--print_config`` and ``--help`` alike. Verbs are
imported lazily: ``lkv --help`` and config parsing never load torch models.

Bad input (a wrong path, shape, setting or asset, a missing or malformed ``--config`` file, an option the
parser refuses) ends with one ``lkv VERB: error: ...`` line and exit status 1 instead of a traceback;
``LKV_TRACEBACK=1`` shows the traceback as well. A run stopped by Ctrl-C or SIGTERM ends with one line
saying what it kept and the command that goes on from there. Known-harmless notices of
the libraries are filtered (:mod:`lkv.core.quiet`); ``LKV_VERBOSE=1`` shows them.
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import sys

from lkv.commands.config_files import check_config_files, config_paths
from lkv.commands.signals import exit_on_sigterm
from lkv.core.quiet import quiet
from lkv.model.assets import AssetsMissingError

LIGHTNING_VERBS = ("fit", "validate", "test")
# What lkv raises for bad input; anything else is a bug and keeps its traceback.
INPUT_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, AssetsMissingError)

# verb -> (what an interrupted run keeps, how it goes on): the line it ends with names the command too
RESUMES: dict[str, tuple[str, str]] = {
    "label": ("the finished shards are kept", "the same command labels the other prompts"),
    "eval": ("the rows so far and their report are kept", "the same command runs the other rows"),
    "sweep": ("the finished points are kept", "the same command runs the other points"),
    "fit": ("the checkpoints so far are kept", "resume from the last one"),
}

# verb -> ("module:function", one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "assets": ("lkv.commands.assets:assets", "fetch and convert the embedded default model and essays"),
    "label": ("lkv.commands.label:label", "generate responses and ground-truth importance label shards"),
    "export": (
        "lkv.commands.export:export",
        "write a trained lookahead module (or probe) as a standalone folder",
    ),
    "generate": ("lkv.commands.generate:generate", "compress a prompt's KV cache and generate"),
    "eval": ("lkv.commands.eval:evaluate", "methods × budgets × tasks evaluation with reports"),
    "sweep": ("lkv.commands.sweep:sweep", "grid of fit (+eval) runs over config keys"),
    "bench": ("lkv.commands.bench:bench", "side-by-side speed and memory benchmarks"),
    "demo": ("lkv.commands.demo:demo", "the embedded default end to end: label → fit → eval → report"),
}


def _usage() -> str:
    lines = ["usage: lkv VERB [--config FILE] [options]", "", "verbs:"]
    lines += [f"  {verb:<9} LightningCLI {verb} (--config configs/X.yaml)" for verb in LIGHTNING_VERBS]
    lines += [f"  {verb:<9} {help_}" for verb, (_, help_) in VERBS.items()]
    lines += ["", "`lkv VERB --help` lists a verb's options."]
    return "\n".join(lines)


def _resolve(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str] | None = None) -> None:
    """Dispatch ``lkv VERB ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return
    verb, rest = args[0], args[1:]
    if verb not in LIGHTNING_VERBS and verb not in VERBS:
        print(f"lkv: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        raise SystemExit(2)
    quiet()
    try:
        check_config_files(rest)
        if verb in LIGHTNING_VERBS:  # Lightning handles SIGTERM itself
            _run(verb, rest)
        else:
            with exit_on_sigterm():
                _run(verb, rest)
    except KeyboardInterrupt:
        print(_stopped(verb, rest, "Ctrl-C"), file=sys.stderr)
        raise SystemExit(130) from None
    except SystemExit as exit_:
        if exit_.code == 128 + signal.SIGTERM:
            print(_stopped(verb, rest, "SIGTERM"), file=sys.stderr)
        raise
    except INPUT_ERRORS as error:
        if os.environ.get("LKV_TRACEBACK"):
            raise
        print(f"lkv {verb}: error: {error}\n(LKV_TRACEBACK=1 shows where it was raised)", file=sys.stderr)
        raise SystemExit(1) from None


def _stopped(verb: str, rest: list[str], how: str) -> str:
    """The line an interrupted verb ends with: what it kept and the command that goes on from there."""
    kept, again = RESUMES.get(verb, ("nothing is kept", "rerun it"))
    command = ["lkv", verb, *rest]
    if verb == "fit" and "--ckpt_path" not in rest and not any(a.startswith("--ckpt_path=") for a in rest):
        command += ["--ckpt_path", "last"]
    return f"lkv {verb}: stopped by {how}; {kept}; {again}: {shlex.join(command)}"


def _run(verb: str, rest: list[str]) -> None:
    from jsonargparse import ArgumentError, auto_cli

    try:
        # a bad option or config value raises here, before the verb runs (no model is loaded)
        if verb in LIGHTNING_VERBS:
            from lkv.train.cli import lightning_main

            lightning_main([verb, *rest])
            return
        result = auto_cli(
            _resolve(VERBS[verb][0]), args=rest, as_positional=False, exit_on_error=False, prog=f"lkv {verb}"
        )
    except ArgumentError as error:
        # jsonargparse's message spans lines; the entry point's error is one line, with where to look
        configs = config_paths(rest)
        where = f"--config {', '.join(configs)}: " if configs else ""
        raise ValueError(
            f"{where}{' '.join(str(error).split())} (`lkv {verb} --help` lists the options)"
        ) from None
    if result is not None:
        print(result)


if __name__ == "__main__":
    main()
