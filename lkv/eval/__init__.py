"""Stage 3, evaluation: tasks, the `lkv eval` runner, reports and cache traces. Never imports Lightning."""
