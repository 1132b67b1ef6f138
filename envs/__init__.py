"""Text environments: the protocol (`envs.base`), a registry, the reference's four
environments with their variants, scripted policies and served environments.

    import envs
    envs.names()
    env = envs.make("sokoban", max_solution_steps=8)
"""

from envs.bandit import Bandit, BanditOptions
from envs.base import Budget, EnvError, TextEnv
from envs.countdown import Countdown, CountdownOptions
from envs.frozenlake import FrozenLake, FrozenLakeOptions
from envs.registry import make, names, register
from envs.sokoban import Sokoban, SokobanOptions

register("bandit", Bandit, BanditOptions)
register("bandit_heldout", Bandit, BanditOptions, low_arm="Trader", high_arm="Librarian")
register("bandit_reversed", Bandit, BanditOptions, low_arm="Dragon", high_arm="Phoenix")
register("sokoban", Sokoban, SokobanOptions)
register("sokoban_larger", Sokoban, SokobanOptions, dim_room=(8, 8), num_boxes=2)
register("sokoban_new_vocab", Sokoban, SokobanOptions, vocab="new")
register("frozenlake", FrozenLake, FrozenLakeOptions)
register("countdown", Countdown, CountdownOptions)

from envs import served  # noqa: E402  (registers "served" once the others are)

__all__ = ["Budget", "EnvError", "TextEnv", "make", "names", "register", "served"]
