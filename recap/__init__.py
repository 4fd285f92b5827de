"""RECAP: training-free speculative decoding for vision-language models by recycling the target's own
predictions into request-local (contextual) and persistent memories.

Main entry points: `recap.runtime.Runtime` (load a model, build drafters), `recap.decode.generate_steps`
(the streaming decode loop) and `recap.decode.generate`. The method itself lives in
`recap.drafters.recap`, with the memories only it learns; what it shares with Token Recycling (records,
the 1-token memory, the recycling keys) in `recap.memory`; docs/architecture.md maps every module.
"""

__version__ = "0.1.0"
