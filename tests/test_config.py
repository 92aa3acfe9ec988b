import pytest

from runtime.engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: CacheConfig(block_size=0), "cache.block_size"),
        (lambda: CacheConfig(block_size=12), "cache.block_size"),
        (lambda: CacheConfig(num_blocks=-1), "cache.num_blocks"),
        (lambda: CacheConfig(enable_prefix_caching="yes"), "cache.enable_prefix_caching"),
        (lambda: SchedulerConfig(max_num_batched_tokens=0), "scheduler.max_num_batched_tokens"),
        (lambda: SchedulerConfig(max_num_seqs=1.5), "scheduler.max_num_seqs"),
        (lambda: SchedulerConfig(policy="lifo"), "scheduler.policy"),
        (lambda: SchedulerConfig(max_model_len=0), "scheduler.max_model_len"),
        (lambda: SchedulerConfig(enable_chunked_prefill=1), "scheduler.enable_chunked_prefill"),
        (lambda: EngineConfig(seed="x"), "seed"),
    ],
)
def test_invalid_values_name_the_field(factory, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        factory()


def test_config_is_frozen_and_round_trips():
    cfg = EngineConfig(cache=CacheConfig(block_size=32), scheduler=SchedulerConfig(policy="priority"))
    with pytest.raises(AttributeError):
        cfg.seed = 3  # type: ignore[misc]
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg


def test_replace_nested_fields_is_validated():
    cfg = EngineConfig().replace(**{"scheduler.max_num_seqs": 8, "cache.num_blocks": 7, "seed": 3})
    assert (cfg.scheduler.max_num_seqs, cfg.cache.num_blocks, cfg.seed) == (8, 7, 3)
    with pytest.raises(ConfigError, match="cache.block_size"):
        cfg.replace(**{"cache.block_size": 3})


def test_from_dict_fills_missing_sections_and_keeps_top_level_fields():
    """A config file or a log header may carry only what differs from the defaults."""
    assert EngineConfig.from_dict({}) == EngineConfig()
    assert EngineConfig.from_dict({"scheduler": {"max_num_seqs": 4}}) == EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4))
    assert EngineConfig.from_dict({"cache": {"num_blocks": 7}}) == EngineConfig(cache=CacheConfig(num_blocks=7))
    cfg = EngineConfig(model_identity="m@1", seed=3)
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg
    assert EngineConfig.from_dict({"seed": 5}).seed == 5


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: CacheConfig(block_size=0), "cache.block_size must be a positive integer, got 0"),
        (lambda: CacheConfig(block_size=12), "cache.block_size must be a power of two, got 12"),
        (lambda: CacheConfig(num_blocks=-1), "cache.num_blocks must be a positive integer, got -1"),
        (lambda: CacheConfig(enable_prefix_caching="yes"), "cache.enable_prefix_caching must be a bool, got 'yes'"),
        (lambda: CacheConfig(hash_salt=3), "cache.hash_salt must be a string, got 3"),
        (lambda: SchedulerConfig(max_num_batched_tokens=True),
         "scheduler.max_num_batched_tokens must be a positive integer, got True"),
        (lambda: SchedulerConfig(max_num_seqs=1.5), "scheduler.max_num_seqs must be a positive integer, got 1.5"),
        (lambda: SchedulerConfig(max_model_len=0), "scheduler.max_model_len must be a positive integer, got 0"),
        (lambda: SchedulerConfig(reserve_full_prompt=1), "scheduler.reserve_full_prompt must be a bool, got 1"),
        (lambda: EngineConfig(cache={}), "cache must be a CacheConfig, got {}"),
        (lambda: EngineConfig(scheduler="fcfs"), "scheduler must be a SchedulerConfig, got 'fcfs'"),
        (lambda: EngineConfig(seed=False), "seed must be an integer, got False"),
        (lambda: SchedulerConfig(policy="lifo"), "scheduler.policy must be one of 'fcfs', 'priority', got 'lifo'"),
    ],
)
def test_a_bad_value_gets_a_one_line_message_naming_field_rule_and_value(factory, message):
    """What a CLI flag or an HTTP parameter that feeds the config shows the user."""
    with pytest.raises(ConfigError) as err:
        factory()
    assert str(err.value) == message
