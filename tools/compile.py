"""Compile the webhook's review path with mypyc, in place: ``make compiled``.

Layer: ROOT (a build script: reads the source tree, runs the C compiler, writes extension
modules beside their sources). Imported by nothing; ``server.compiled`` is what checks,
at a test run's or a server's start, that no compiled module is older than its source.

Why these modules: they are what the webhook runs for every admission review it decides
(``webhook.review_flow.review`` and what it calls), pure and ``mypy --strict``-typed, so
mypyc turns them into C without a change of meaning. Compiled, a review whose answer is
computed costs about three quarters of the CPU (``python -m loadtest.bench.review_cpu
--against``), and that CPU is most of what the webhook spends per review under load.
Nothing else is compiled: the I/O shells gain little, and every compiled module is one
more place where a stale build could hide an edit.

Why in place: the project is installed editable, so a module is imported from beside its
source; an extension module there takes precedence over the ``.py``. The make rule lists
the sources as prerequisites, so an edit rebuilds; a run that skips make (``pytest``
alone, ``python -m webhook``) is stopped by ``server.compiled.check_fresh`` instead of
silently running the old code. ``make clean-compiled`` removes them.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Final

from mypyc.build import mypycify
from setuptools import setup  # type: ignore[import-untyped,unused-ignore]

ROOT: Final = Path(__file__).resolve().parent.parent

MODULES: Final = (
    "cluster/quantity.py",
    "cluster/convert/demand.py",
    "webhook/patch.py",
    "webhook/workload.py",
    "webhook/answers.py",
    "webhook/review.py",
    "webhook/rules/outcome.py",
    "webhook/rules/queue.py",
    "webhook/rules/placement.py",
    "webhook/rules/gang.py",
    "webhook/rules/namespace.py",
    "webhook/admit.py",
    "webhook/review_flow.py",
)
"""The review path, leaves first. Not ``webhook/review_models.py``: pydantic builds its
wire models at run time, which mypyc cannot compile."""

PACKAGES: Final = ("cluster", "server", "webhook", "extender")


def clean() -> None:
    """Every extension module in the packages and mypyc's shared library beside them:
    a module no longer listed must not stay compiled."""
    for suffix in EXTENSION_SUFFIXES:
        for built in [p for package in PACKAGES for p in (ROOT / package).rglob("*" + suffix)]:
            built.unlink()
        for shared in ROOT.glob("*__mypyc*" + suffix):
            shared.unlink()
    shutil.rmtree(ROOT / "build" / "mypyc", ignore_errors=True)


def missing_toolchain() -> str:
    """What a build lacks on this machine (a C compiler, Python's headers), or empty."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        return f"no Python headers ({headers}; Debian: apt install python3-dev)"
    return ""


def build() -> None:
    os.chdir(ROOT)
    clean()
    lacking = missing_toolchain()
    if lacking:
        # The sources are the same program: the suite still tests it, only slower to serve.
        print(f"tools/compile.py: {lacking}: the review path runs as Python", file=sys.stderr)
        return
    extensions = mypycify(list(MODULES), opt_level="3", debug_level="0", target_dir="build/mypyc")
    setup(
        name="tessera-compiled",
        packages=[],
        ext_modules=extensions,
        script_args=[
            "--quiet",
            "build_ext",
            "--inplace",
            "--build-temp=build/mypyc/temp",
            "--build-lib=build/mypyc/lib",
        ],
    )


def main(argv: list[str]) -> int:
    if argv[1:] == ["--clean"]:
        clean()
    elif argv[1:]:
        print("usage: python tools/compile.py [--clean]", file=sys.stderr)
        return 2
    else:
        build()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
