"""TextWorld games, generated locally from the seed: ``textworld``.

    env = envs.make("textworld", rooms=3, objects=5, quest_length=3)
    text = env.reset(seed=7)              # generates (once) and starts game 7

Each seed is a game made by TextWorld's own generator (no download): `rooms`
rooms, `objects` objects and a quest of `quest_length` steps. Generated games are
kept in `cache` (default: ``starpo-textworld`` in the temporary folder), one folder
per game, written atomically, so a game is compiled once per machine.

The state is the game's last text (the room description after a reset), followed
by the admissible commands, which are the action words: they change with the
state. The reward is the change of the game's score; `success` is the game's win.
The walkthrough from the current state (`walkthrough_action`) is the expert
policy. Needs the ``textworld`` package (``pip install -e '.[envs]'``), Linux or
macOS.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.base import Budget, EnvError, TextEnv


@dataclass(frozen=True)
class TextWorldOptions:
    rooms: int = 3  # rooms in the map
    objects: int = 5  # objects in the world
    quest_length: int = 3  # actions the quest's walkthrough takes
    cache: str | None = None  # folder of generated games (None: starpo-textworld in the temporary folder)

    def __post_init__(self) -> None:
        for name in ("rooms", "objects", "quest_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


_PROMPT = re.compile(r"\n>.*$", re.DOTALL)  # the prompt line and the status bar after it


def _clean(text: str) -> str:
    text = _PROMPT.sub("", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def game_file(opts: TextWorldOptions, seed: int) -> Path:
    """The compiled game of `seed` (generated into the cache the first time)."""
    import textworld

    key = f"{textworld.__version__}:{opts.rooms}:{opts.objects}:{opts.quest_length}:{seed}"
    folder = Path(opts.cache or Path(tempfile.gettempdir()) / "starpo-textworld")
    target = folder / hashlib.sha256(key.encode()).hexdigest()[:16]
    path = target / "game.z8"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))
    try:
        options = textworld.GameOptions()
        options.seeds = int(hashlib.sha256(str(seed).encode()).hexdigest()[:8], 16)  # TextWorld takes 32 bits
        options.nb_rooms, options.nb_objects, options.quest_length = opts.rooms, opts.objects, opts.quest_length
        options.path = str(staging / "game.z8")
        options.force_recompile = True
        try:
            textworld.make(options)
        except Exception as exc:  # the generator's own errors: a quest that cannot be built, ...
            raise EnvError(f"environment 'textworld': no game for seed {seed} with {opts}: {exc}") from None
        try:
            os.rename(staging, target)  # atomic; another process may have made it meanwhile
        except OSError:
            if not path.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


class TextWorldGame(TextEnv):
    """A generated TextWorld game behind the text protocol (module docstring)."""

    budget = Budget(max_turns=8, max_actions_per_traj=16, max_actions_per_turn=2)

    def __init__(self, opts: TextWorldOptions) -> None:
        super().__init__()
        if importlib.util.find_spec("textworld") is None:  # found, not imported: a spec check stays quick
            raise EnvError("environment 'textworld' needs textworld: pip install -e '.[envs]'")
        self.opts = opts
        self.game: Any = None
        self.state: Any = None
        self.text = ""
        self.commands: list[str] = []  # taken since the reset (a copy replays them)

    @property
    def action_words(self) -> tuple[str, ...]:
        return tuple(self.state.admissible_commands) if self.state is not None else ()

    @property
    def instructions(self) -> str:
        objective = self.state.objective if self.state is not None else ""
        return (
            f"You are playing a text adventure. {objective} Each turn you see what happened and the "
            f"admissible commands; answer with commands from that list, written as listed."
        )

    def _reset(self, seed: int) -> None:
        import textworld

        if self.game is not None:
            self.game.close()
        infos = textworld.EnvInfos(
            admissible_commands=True,
            objective=True,
            policy_commands=True,
            won=True,
            lost=True,
            score=True,
            description=True,
        )
        with warnings.catch_warnings():  # Jericho's notice that generated games lack its score detection
            warnings.simplefilter("ignore")
            self.game = textworld.start(str(game_file(self.opts, seed)), request_infos=infos)
        self.state = self.game.reset()
        self.text, self.commands = _clean(self.state.description), []

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        before = self.state.score
        self.state, _, done = self.game.step(action)
        self.commands.append(action)
        self.text = _clean(self.state.feedback)
        self.success = bool(self.state.won)
        self.done = bool(done)
        return float(self.state.score - before), {}

    def render(self) -> str:
        return f"{self.text}\nAdmissible commands: {', '.join(self.action_words)}"

    def walkthrough_action(self) -> str:
        """The next command of the game's walkthrough from the current state."""
        commands = self.state.policy_commands
        if not commands:
            raise EnvError("environment 'textworld': the game has no walkthrough from this state")
        return commands[0]

    def __deepcopy__(self, memo: dict[int, Any]) -> TextWorldGame:
        """A copy in the same state: the same game, its commands replayed."""
        copy = TextWorldGame(self.opts)
        copy.reset(self.seed)
        for command in self.commands:
            copy.step(command)
        return copy

    def __del__(self) -> None:
        if getattr(self, "game", None) is not None:
            self.game.close()
