"""A process that imports the modules given, then forks a child per request (tests/children.py's
`Forked`): a child program that imports torch anyway starts in a fraction of a second instead
of the ~3 s of CPU torch's import takes (about a third of `make test`'s time went to children,
most of their cost in imports).

    python zygote.py MODULE[,MODULE...]

Requests come on stdin, one JSON line each: {argv, code, filename, cwd, stdout, stderr,
session}. For each the zygote forks; it replies ``{"pid": ...}`` at once and
``{"status": ...}`` (`os.waitstatus_to_exitcode`) when the child ended. The child is the
program run as ``python -c code`` (or ``python filename``) would run it from here on: fds 0-2
redirected, `sys.argv`, a fresh ``__main__``, the working directory of the request; it ends as
an interpreter does (atexit, finalizers, non-daemon threads joined, an uncaught exception
printed with exit code 1). Its environment is the zygote's, which started with the children's
(one zygote per environment, see `Forked`), as the imports here changed it (paddle sets
OMP_NUM_THREADS): what the program's own imports would have left.

What a fork keeps that a fresh interpreter would not have: numpy's global random state (the
same in every child; `random` reseeds itself at a fork), and the imports' objects frozen out
of the garbage collector (`gc.freeze`: they die by their reference counts only). Programs
that need a fresh interpreter do not use it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import types
from typing import Any


def _child(request: dict[str, Any]) -> None:
    if request["session"]:
        os.setsid()  # (a hang is ended by killing the session: ranks it forked go too)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    out = os.open(request["stdout"], flags)
    err = out if request["stderr"] == request["stdout"] else os.open(request["stderr"], flags)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        os.close(fd)
    os.chdir(request["cwd"])
    sys.argv = request["argv"]
    main = types.ModuleType("__main__")
    filename = request["filename"]
    if filename is None:
        source, filename = request["code"], "<string>"
        sys.path[0] = ""  # (as `python -c`: the working directory)
    else:
        with open(filename, encoding="utf-8") as f:
            source = f.read()
        main.__file__ = filename
        sys.path[0] = os.path.dirname(os.path.abspath(filename))  # (as `python FILE`)
    sys.modules["__main__"] = main
    # An exception leaves through the zygote's frames to the top, printed by the interpreter,
    # exit code 1; SystemExit too, with its code. Either way the interpreter then shuts down.
    exec(compile(source, filename, "exec"), main.__dict__)
    raise SystemExit(0)


def _reply(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def serve() -> None:
    for line in sys.stdin:  # (closed: the test session is over)
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"status": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    for name in filter(None, sys.argv[1].split(",")):
        __import__(name)
    # what the imports made is never collected in a child (as tests/conftest.py does for the
    # test session): a child's collections scan only what it made, and they do not write to
    # (copy) every page the imports filled
    gc.collect()
    gc.freeze()
    serve()
