"""The two action spaces as turns of one loop: ``code_turn`` (the model's code blocks run in
the rollout's sandbox, what they print comes back) and ``tools_turn`` (the tool-calling
baseline: JSON function calls, results serialized to text). Both speak only to the small
protocols in ``_context`` (:class:`TurnContext`, :class:`TurnSession`); replies are parsed by
``_parse`` (fenced code, tool calls written as text) and observations bounded by
``_observe``; ``_order`` finds the later block that defines a name a block used too early.
The executor imports those modules directly; what other layers use is the observation's
rendering (the framework adapters show a turn the way the agent loop does)."""


__all__: list[str] = []
