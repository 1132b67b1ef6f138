"""Agent programs written only against the official `openai` client: what agent mode
trains (``agent.program``, docs/agents.md)."""
