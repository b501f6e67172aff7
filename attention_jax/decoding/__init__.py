"""Writing text with a model: what `generate` runs, one room a step.

`generate`: `generate` and `Decoder` (the model prepared once for many calls); `loops`: the
compiled decoding loops and the draw of each next token; `kv_cache`: the key/value cache, as
twins swapped into the model; `layout`: the weights laid out as decoding reads them (bfloat16,
int8), twins too; `memory`: whether a batch fits, asked before it is allocated. Import each by
its room, `from attention_jax.decoding.generate import generate` (or `attention_jax.generate`);
nothing here is imported until asked.
"""
