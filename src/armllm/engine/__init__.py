"""The engine: sequences, KV block accounting, scheduling, the model runner
and the step loop."""
