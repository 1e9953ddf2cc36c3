"""Whether a build gets an FVP run, decided when the plan is made: which FVP, which runner, or why not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from npubuild.config.accelerator import GENERATIONS, Accelerator, Generation
from npubuild.config.load import Build


def find_fvp(platform: str, family: Generation, configured: str | None,
             base: Path | None = None) -> tuple[Path | None, str]:
    """The FVP executable for this target (fvp.executable, else the platform's FVP on PATH), or None and why.

    A configured path with a directory part is relative to `base` (the spec's directory); a bare name is
    looked up on PATH.
    """
    if configured:
        p = Path(configured).expanduser()
        if base is not None and not p.is_absolute() and len(p.parts) > 1:
            p = base / p
        if p.is_file() and os.access(p, os.X_OK):
            return p.resolve(), ""
        found = shutil.which(configured)
        if found:
            return Path(found).resolve(), ""
        return None, f"fvp.executable '{configured}' is not an executable file"
    name = GENERATIONS[family].fvp.get(platform)
    if name is None:
        return None, f"no Corstone FVP is known for {family} on platform {platform}"
    found = shutil.which(name)
    if found is None:
        return None, f"no FVP found ({name} is not on PATH and fvp.executable is not set)"
    return Path(found).resolve(), ""


def fvp_decision(b: Build) -> tuple[dict | None, Path | None, str | None]:
    """(stage config, runner ELF, None) to run the FVP; (config with an error, None, None) when `required`
    cannot be met; (None, None, reason) to skip."""
    mode = b.spec.verify.fvp
    if mode == "off":
        return None, None, "verify.fvp is off"
    if b.pipeline.profile != "int":
        return None, None, "FP profile: the NPU runs integer graphs only"
    opts, runner = b.spec.fvp, b.fvp_runner  # resolved and checked when the spec was loaded
    acc = Accelerator.parse(b.target.accelerator)
    family = acc.generation
    exe, why = find_fvp(b.target.platform, family, opts.executable, b.spec_path.parent)
    if exe is None:
        reason = why
    elif runner is None:
        reason = "no runner application configured (fvp.runner: path to the runner ELF)"
    elif not b.spec.verify.tosa:
        reason = "verify.tosa is off: no TOSA reference outputs to compare the FVP's with"
    else:
        st = exe.stat()
        return ({"platform": b.target.platform, "family": family, "macs": acc.macs,
                 "fvp": {**opts.model_dump(), "executable": str(exe)},
                 "fvp_binary": {"size": st.st_size, "mtime_ns": st.st_mtime_ns}, "error": None, "mode": mode},
                runner, None)
    if mode == "required":
        return {"error": f"verify.fvp is required but {reason}"}, None, None
    return None, None, reason
