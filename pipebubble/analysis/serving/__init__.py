"""LLM serving traces: engine steps (labelled or inferred), prefill/decode interference, and requests an
engine writes into its own trace."""
