"""Engine tests run torch with one intra-op thread (the autouse fixture says why)."""

from tests.support.engine_hosts import one_torch_thread  # noqa: F401 (an autouse fixture)
