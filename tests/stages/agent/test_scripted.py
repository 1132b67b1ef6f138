import envs
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig, Episode, EpisodeSpec, run_episodes
from stages.agent.scripted import scripted


def holes_entered(tokenizer, noise):
    cfg = AgentConfig(think=False, history=0, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    chat = Chat(tokenizer, cfg.think)
    eps = [
        Episode(envs.make("frozenlake", slippery=False), EpisodeSpec("frozenlake", "{}", s, s, 0), cfg, chat)
        for s in range(60)
    ]
    run_episodes(eps, scripted("expert", tokenizer, cfg.think, 0, random_share=1.0, noise=noise))
    return sum(e.env.pos in e.env.holes for e in eps)


def test_the_noise_of_a_noisy_demonstrator_comes_from_the_named_policy(tokenizer):
    assert holes_entered(tokenizer, "random_valid") > 5
    assert holes_entered(tokenizer, "random_safe") == 0
