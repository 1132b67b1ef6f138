"""Text environments: the protocol (`envs.base`), a registry, the reference's four
environments with their variants, task records of your own (``records``), scripted
policies, served environments, OpenEnv servers (``openenv``), and
adapters for Gymnasium (``gym:<id>``), TextWorld (``textworld``), reasoning-gym
(``reasoning_gym``) and verifiers (``verifiers``).

    import envs
    envs.names()
    env = envs.make("sokoban", max_solution_steps=8)
"""

from envs.bandit import Bandit, BanditOptions
from envs.base import Budget, EnvError, TextEnv
from envs.countdown import Countdown, CountdownOptions
from envs.frozenlake import FrozenLake, FrozenLakeOptions
from envs.records import Records, RecordsOptions
from envs.registry import data_digest, make, names, register, register_prefix
from envs.sokoban import Sokoban, SokobanOptions

register("bandit", Bandit, BanditOptions)
register("bandit_heldout", Bandit, BanditOptions, low_arm="Trader", high_arm="Librarian")
register("bandit_reversed", Bandit, BanditOptions, low_arm="Dragon", high_arm="Phoenix")
register("sokoban", Sokoban, SokobanOptions)
register("sokoban_larger", Sokoban, SokobanOptions, dim_room=(8, 8), num_boxes=2)
register("sokoban_new_vocab", Sokoban, SokobanOptions, vocab="new")
register("frozenlake", FrozenLake, FrozenLakeOptions)
register("countdown", Countdown, CountdownOptions)
register("records", Records, RecordsOptions)

from envs import (  # noqa: E402  (register "gym:<id>", "served", "openenv", "textworld", "reasoning_gym", "verifiers")
    gym_text,
    openenv,
    reasoning_gym,
    served,
    textworld_games,
    verifiers_env,
)

register_prefix(gym_text.PREFIX, gym_text.make_gym, gym_text.LISTED)
register("textworld", textworld_games.TextWorldGame, textworld_games.TextWorldOptions)
register("reasoning_gym", reasoning_gym.ReasoningGym, reasoning_gym.ReasoningGymOptions)
# here, beside the others; `python -m envs.served` runs envs/served/__main__.py
register("served", served.ServedEnv, served.ServedOptions)
register("openenv", openenv.OpenEnv, openenv.OpenEnvOptions)
register("verifiers", verifiers_env.Verifiers, verifiers_env.VerifiersOptions)

__all__ = ["Budget", "EnvError", "TextEnv", "data_digest", "make", "names", "register", "register_prefix", "served"]
