"""npu-sim: a bit-exact functional model of the Ethos-U55/U65 and Ethos-U85 command streams.

It executes Vela's raw output (`--output-format raw` .npz: driver header +
register command stream, compressed weights, scratch sizes, I/O placement) one
NPU_OP at a time on numpy arrays, so a compiled artifact can be checked against
the TOSA reference model on any machine, without Arm's FVP.

Modules: npz (loading), cmdstream (decoding, register snapshots), weights (our
own decoder of the standard weight stream and the U55/U65 hardware ordering),
fmap (NHWC / NHCWB16 addressing), memory (the regions every machine runs on),
npu_op (what every generation's ops share), sim (`run` takes either
generation); u55/ the Ethos-U55/U65 machine and op execution; u85/ the
Ethos-U85 register map, weight formats and machine.
"""

from npubuild.errors import StageError


class NotModelled(StageError):
    """A valid command stream using a feature npu-sim does not model yet: verification cannot conclude."""


class VelaMiscompile(StageError):
    """A command stream the hardware cannot run as the graph means (Vela's mistake, not npu-sim's): fails the build."""
