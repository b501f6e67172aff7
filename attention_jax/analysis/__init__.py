"""Looking inside a model and taking it apart: the analyses, each a room of its own.

`inspect`: hook points recorded or patched (`run_with_cache`, `patched`), ablations, the logit
lens; `patching`: activation and attribution patching sweeps; `edges`: the model as a graph of
senders and receivers, patched through the model's own forward with edge twins in;
`discovery`: every edge's effect (exact, EAP, EAP-IG), ACDC, circuits and their faithfulness;
`circuits`: the Mathematical Framework's QK/OV circuits and composition scores; `viewer`: the
attention viewer, a page that works offline. Import each by its room,
`from attention_jax.analysis.inspect import run_with_cache`; nothing here is imported until asked.
"""
