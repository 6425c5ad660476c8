"""spec: speculative decoding. A proposer guesses the next k tokens of a running
completion; the engine verifies them in one forward (k + 1 rows next to the other
sequences' rows) and keeps the longest prefix the target model would have
produced itself, plus the target's own next token.

- config.py: SpeculativeConfig (vLLM's --speculative-config spelling), validated.
- proposer.py: what every proposer implements (Proposer, ProposeInput, Draft).
- ngram.py, suffix.py: lookup proposers (no model); suffix_tree.py: the counted,
  depth-cut suffix trie suffix decoding reads; history.py: whether a sequence's
  tokens still continue what a lookup proposer indexed.
- draft_model.py: a smaller checkpoint, or the target's first layers (self-draft).
- mtp.py: a model's own multi-token-prediction block (Qwen3.5/3.6).
- draft_batch.py: the batch arrays of a draft model's or MTP block's own forward.
- verify.py: accepting drafts exactly (greedy, and rejection sampling).
- controller.py: how many tokens each sequence drafts this step (its acceptance,
  the measured cost of verify rows), and the acceptance counters.
- speculator.py: the engine's side: after each step, which sequences draft how
  many tokens, and asking the proposer for them; building the proposer."""
