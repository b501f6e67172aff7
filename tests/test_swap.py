"""attention_jax.swap: select a part by its path, swap it, put it back (whatever the body does)."""
import numpy as np
import pytest
from flax import nnx

from attention_jax import ConfigError, ModelConfig
from attention_jax.layers import Bidirectional, CausalMask
from attention_jax.model import LanguageModel
from attention_jax.swap import Swapped, replaced, select, swap, twins


def _model():
    cfg = ModelConfig(vocab_size=11, context=6, d_model=8, n_heads=2, n_layers=2, mixer="heads")
    return LanguageModel(cfg, rngs=nnx.Rngs(0))


TOKENS = np.array([[1, 2, 3, 4, 5, 6]])


def test_select_reads_attributes_and_list_items_by_a_dotted_path():
    model = _model()
    assert select(model, "blocks.1.mixer") is model.blocks[1].mixer
    assert select(model, "blocks.0.mixer.attention.mask") is model.blocks[0].mixer.attention.mask


@pytest.mark.parametrize("path", ["blocks.7.mixer", "blocks.0.nothing", "blocks.x"])
def test_a_path_that_is_not_there_is_refused_by_name(path):
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        select(_model(), path)


def test_swap_changes_the_numbers_and_undo_puts_the_same_objects_back():
    model = _model()
    before, mixer = np.asarray(model(TOKENS)), model.blocks[0].mixer
    undo = swap(model, {"blocks.0.mixer": None})
    assert model.blocks[0].mixer is None
    assert not np.allclose(np.asarray(model(TOKENS)), before)
    undo()
    assert model.blocks[0].mixer is mixer
    np.testing.assert_array_equal(np.asarray(model(TOKENS)), before)


def test_a_swap_through_a_part_swapped_earlier_is_undone_in_reverse():
    model = _model()
    mixer, mask = model.blocks[0].mixer, model.blocks[0].mixer.attention.mask
    other = LanguageModel(model.config, rngs=nnx.Rngs(1)).blocks[0].mixer
    undo = swap(model, {"blocks.0.mixer": other, "blocks.0.mixer.attention.mask": Bidirectional()})
    assert isinstance(other.attention.mask, Bidirectional)
    undo()
    assert model.blocks[0].mixer is mixer and mixer.attention.mask is mask
    assert type(other.attention.mask) is CausalMask


def test_a_bad_path_in_the_middle_undoes_what_was_done_before_it():
    model = _model()
    mixer = model.blocks[0].mixer
    with pytest.raises(ConfigError, match="blocks.9"):
        swap(model, {"blocks.0.mixer": None, "blocks.9.mixer": None})
    assert model.blocks[0].mixer is mixer


def test_replaced_puts_the_part_back_even_when_the_body_raises():
    model = _model()
    mask = model.blocks[1].mixer.attention.mask
    with pytest.raises(RuntimeError, match="body"):
        with replaced(model, {"blocks.1.mixer.attention.mask": Bidirectional()}):
            assert isinstance(model.blocks[1].mixer.attention.mask, Bidirectional)
            raise RuntimeError("body")
    assert model.blocks[1].mixer.attention.mask is mask


def test_swapped_is_a_context_that_undoes_its_own_parts():
    model = _model()
    mixer = model.blocks[1].mixer
    with Swapped(model, {"blocks.1.mixer": None}) as swapped_model:
        assert swapped_model is model and model.blocks[1].mixer is None
    assert model.blocks[1].mixer is mixer


def test_twins_reads_a_table_by_class_its_nearest_base_and_none_for_kept():
    from attention_jax.layers import Dense
    from attention_jax.model import MultiHeadAttention

    class Twin(nnx.Module):
        def __init__(self, reference):
            self.reference = reference

    class Special(Dense):
        pass
    model = _model()
    model.blocks[1].ffn.up.__class__ = Special           # a subclass: read by Dense's entry
    seen = []
    table = {Dense: lambda part, path, *, note: seen.append((path, note)) or Twin(part),
             MultiHeadAttention: None}
    parts = twins(model, table, note="n")
    dense = sorted(p for p, m in nnx.iter_modules(model) if isinstance(m, Dense) for p in [".".join(map(str, p))])
    assert sorted(parts) == dense and all(note == "n" for _, note in seen)
    assert "blocks.1.ffn.up" in parts and all(isinstance(t, Twin) for t in parts.values())
    with Swapped(model, parts):                          # a twin's reference is not looked into again
        assert twins(model, {Dense: lambda part, path, **_: Twin(part)}) == {}
    assert twins(model, {Dense: lambda part, path, **_: None}) == {}
