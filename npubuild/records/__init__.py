"""The typed records between the stages and their readers, at the ground: nothing here imports from above.

iospec (how a TOSA graph's input or output maps to its ONNX tensor), lower (io.json: the lowered graphs and each
family's partitions), vela (summary.json: per compiled partition its files and figures), check (numerics.json),
accuracy (a graph's measures against the float model: the deployable's in npusim.json, the TOSA graphs' in
numerics.json), evaluate (evaluate.json), npusim (npusim.json), fvp (fvp.json), build (a stage's record and status, a build's report entry, the task outcomes, one
Skip). Each writes its file as it has always been written (`to_json`) and reads it back typed
(`from_json`), so a reader takes fields, never file-name suffixes or string keys.
"""
