"""Agent mode: an OpenAI-compatible endpoint in front of the policy (docs/agents.md).

A rollout or eval whose ``agent.program`` names a program runs it once per episode
(`stages.endpoint.programs`) against ``/v1/chat/completions`` served on loopback by the
engine host (`stages.endpoint.server`). Every call's prompt token ids, sampled token ids
and log-probs are recorded (`stages.endpoint.transcript`), so an episode's calls become
its trajectory's samples with exactly the sampled tokens under the loss mask, whatever
text the program sends back; `stages.endpoint.episodes` plays a batch of episodes this way.
"""
