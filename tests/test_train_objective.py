"""attention_jax.train.objective: the fields the optimizer reads are the ones the Engine's key holds."""

from attention_jax.train.objective import OPTIMIZER_FIELDS

from helpers import TC


def test_the_key_holds_every_field_the_optimizer_reads():
    """A TrainConfig field the optimizer reads and the key left out would serve one lr's program to another."""
    import inspect
    from attention_jax.train import objective
    read = {f for f in TC.__dataclass_fields__
            if f"tc.{f}" in inspect.getsource(objective.lr_schedule) + inspect.getsource(objective.make_optimizer)}
    assert read == set(OPTIMIZER_FIELDS) - {"steps"} | ({"steps"} & read)
    assert {"log_every", "eval_every", "checkpoint_every", "train_eval_windows", "eval_batch"}.isdisjoint(OPTIMIZER_FIELDS)
