"""``run.stash``: per-run state kept by typed keys, so plugins never clash over attribute names.

pytest's ``config.stash`` is the model. A plugin makes a key once, at module level, naming the
type of what it keeps, and reads and writes through it::

    SEEN = hookdet.plugin.StashKey[int]("my_plugin.seen")

    @hookimpl
    def on_validation_end(run, metrics):
        run.stash[SEEN] = run.stash.get(SEEN, 0) + 1

A key is compared by identity, so two plugins that both say ``"seen"`` hold two values. The
host keeps what it shares with plugins under keys of its own (:data:`hookdet.plugin.TRIAL_CALLBACKS`,
``WORKLOAD_METRICS``, ``TENSORBOARD_METRICS``).
"""
from __future__ import annotations

from typing import Any, Dict, Generic, TypeVar, Union

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    """A key of :class:`Stash` whose value is a ``T``; ``name`` shows in errors and reprs."""

    __slots__ = ("name",)

    def __init__(self, name: str = "") -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StashKey({self.name!r})"


class Stash:
    """A mapping from :class:`StashKey` to values of the key's type."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: Dict[StashKey[Any], Any] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._values[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        try:
            return self._values[key]
        except KeyError:
            raise KeyError(f"nothing is stashed under {key!r}") from None

    def get(self, key: StashKey[T], default: D) -> Union[T, D]:
        """The value under ``key``, or ``default``."""
        return self._values.get(key, default)

    def setdefault(self, key: StashKey[T], default: T) -> T:
        """The value under ``key``, storing ``default`` there first when there is none."""
        return self._values.setdefault(key, default)

    def __delitem__(self, key: StashKey[T]) -> None:
        del self._values[key]

    def __contains__(self, key: StashKey[Any]) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)
