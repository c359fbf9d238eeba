"""Measurement (docs/DESIGN.md section 5): what a cell measures around and after its decoding.

- ``window``: the timed, metered window at every batch size (``run_window``);
- ``records``: its protocol, per-generation records, result and summary, predictions, per-request latencies;
- ``costs``: step costs outside the window (Leviathan's t_ar, t_draft, t_verify) and the machine's speed probe;
- ``energy`` (factory and summary) and ``meters`` (NVML, RAPL, Zeus): energy of a window;
- ``acceptance``: acceptance metrics in the field's conventions, specdec_bench's speculation profile;
- ``bounds``: Leviathan et al.'s arithmetic.

Import from the modules (``from pipeline.measure.window import run_window``); this package re-exports nothing, so
that importing one module (``pipeline.device`` needs ``meters``) does not load the window and its imports.
"""
