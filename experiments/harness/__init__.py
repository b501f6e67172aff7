"""What every experiment shares: the command line, the row cache, the results writer, the platform.

`cli`: presets, flags and the one-line error convention; `rows`: a table's rows (`Table`),
trained alike, with a cache of finished rows and a checkpoint folder each; `report`: tables, claims,
results.json and figures; `platform`: the accelerator found and the CPU allocator setup.
"""
