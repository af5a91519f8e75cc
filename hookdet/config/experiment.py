"""The whole experiment file as one validated model, :class:`ExperimentConfig`, and the trial
seed Determined's master would give a trial of it."""
from __future__ import annotations

import copy
import os
import random
from typing import Any, Dict, List, Literal, Mapping, Optional, Union

from pydantic import Field, PrivateAttr, field_validator, model_validator

from hookdet.config.blocks import (
    PLUGIN_NAME,
    check_global_batch_size,
    plain_value,
    read_only_plugins,
    reduce_hyperparameters,
    runs_a_command,
    trial_spec_from_entrypoint,
)
from hookdet.config.problems import FieldProblem, as_written, dotted
from hookdet.config.sections import (
    MAX_EXPERIMENT_SEED,
    RETENTION_KEYS,
    CheckpointStorageConfig,
    Length,
    OptimizationsConfig,
    ReproducibilityConfig,
    ResourcesConfig,
    SearcherConfig,
    Section,
)
from hookdet.search.space import searched_names

class ExperimentConfig(Section):
    """A validated experiment file with Determined's defaults filled in.

    Build it with :func:`load_experiment_config` or :func:`parse_experiment_config` (which also
    accept Determined's cluster-only fields and give file/line errors); constructing it directly
    validates the same fields without those two extras.
    """

    name: Optional[str] = None
    description: Optional[str] = None
    entrypoint: Optional[str] = None
    hyperparameters: Dict[str, Any] = Field(default_factory=dict)
    searcher: SearcherConfig = Field(default_factory=SearcherConfig)
    records_per_epoch: Optional[int] = Field(None, ge=0)
    min_validation_period: Optional[Length] = None
    min_checkpoint_period: Optional[Length] = None
    scheduling_unit: int = Field(100, ge=1)
    perform_initial_validation: bool = False
    optimizations: OptimizationsConfig = Field(default_factory=OptimizationsConfig)
    checkpoint_storage: Optional[CheckpointStorageConfig] = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    reproducibility: ReproducibilityConfig = Field(default_factory=ReproducibilityConfig)
    data: Dict[str, Any] = Field(default_factory=dict)
    #: A list (names add to the defaults, ``no:<name>`` removes one) or ``{only: [...]}``;
    #: resolved by :mod:`hookdet.plugins.selection`, read through ``run.plugin_names``.
    plugins: Optional[Union[List[str], Dict[str, List[str]]]] = None
    plugin_config: Dict[str, Dict[str, Any]] = Field(default_factory=dict)

    # Defaults, not ``default_factory=list``: pydantic copies a private default per instance, and
    # it reads a factory's signature, which for a builtin copies ``sys.modules`` (in a segment
    # forked from the warm process, that writes to the page of every module object).
    _ignored_fields: List[str] = PrivateAttr(default=[])
    _source: str = PrivateAttr(default="<dict>")
    _plugin_config_lines: Dict[str, int] = PrivateAttr(default={})
    _hyperparameter_space: Optional[Dict[str, Any]] = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _a_commands_length_may_be_unitless(cls, data: Any) -> Any:
        """A bare ``searcher.max_length: 100`` is the documented input of Determined's Core API
        searcher (its deprecated operation's length, in the script's own unit): accepted for a
        command entrypoint (counted as batches, kept bare); a trial class's is refused naming
        the units (:func:`~hookdet.config.sections.bare_length_refusal`)."""
        searcher = data.get("searcher") if isinstance(data, Mapping) else None
        length = searcher.get("max_length") if isinstance(searcher, Mapping) else None
        if isinstance(length, int) and not isinstance(length, bool) and length >= 1 \
                and runs_a_command(data.get("entrypoint")):
            data = {**data, "searcher": {**searcher, "max_length": Length(unit="batches", value=length, unitless=True)}}
        return data

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _read_entrypoint(cls, raw: Any) -> str:
        return trial_spec_from_entrypoint(raw)

    @field_validator("checkpoint_storage", mode="before")
    @classmethod
    def _retention_only_means_default_storage(cls, raw: Any) -> Any:
        if isinstance(raw, Mapping) and "type" not in raw and set(raw) <= RETENTION_KEYS:
            return {**raw, "type": "default"}
        return raw

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _read_hyperparameters(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return raw
        reduced = reduce_hyperparameters(raw, ())
        if searched_names(reduced):
            return plain_value(raw, ())  # the space; sampled in _sample_hyperparameters
        check_global_batch_size(reduced)
        return reduced

    @model_validator(mode="after")
    def _sample_hyperparameters(self) -> "ExperimentConfig":
        """A file with a search space trains, as one run, trial 1 of its search: the values
        and seed Determined's master draws first from ``experiment_seed`` (what its ``single``
        searcher trains). The space stays in :attr:`hyperparameter_space` for a search."""
        if not searched_names(self.hyperparameters):
            return self
        from hookdet.search.space import first_trial

        draw = first_trial(self.hyperparameters, self.reproducibility.experiment_seed)
        self._hyperparameter_space = self.hyperparameters
        try:
            check_global_batch_size(draw.hparams)
        except FieldProblem as problem:
            raise ValueError(f"hyperparameters.{dotted(problem.subpath)}: {problem}") from None
        self.hyperparameters = draw.hparams
        return self

    @field_validator("min_validation_period", "min_checkpoint_period", mode="before")
    @classmethod
    def _read_period(cls, raw: Any) -> Optional[Length]:
        """A period of 0 (Determined's default, ``{batches: 0}``) means none, as absence does."""
        period = Length.parse(raw)
        return period if period.value > 0 else None

    @field_validator("data", mode="before")
    @classmethod
    def _read_data(cls, raw: Any) -> Any:
        return plain_value(raw, ()) if isinstance(raw, Mapping) else raw

    @field_validator("plugins", mode="before")
    @classmethod
    def _read_plugins(cls, raw: Any) -> Any:
        if isinstance(raw, Mapping):
            return read_only_plugins(raw)
        if not isinstance(raw, list):
            raise ValueError(
                f"expected a list of plugin names like [checkpoint, amp]; got {as_written(raw)} (names "
                "add to the defaults, 'no:<name>' removes one, {only: [...]} runs exactly those)"
            )
        seen = set()
        for index, name in enumerate(raw):
            if not isinstance(name, str) or not PLUGIN_NAME.match(name):
                raise FieldProblem(
                    (str(index),),
                    f"expected a plugin name (or 'no:<name>' to drop a default); got {as_written(name)}",
                )
            plain = name[3:] if name.startswith("no:") else name.lstrip("+")
            if plain in seen:
                raise FieldProblem((str(index),), f"plugin '{plain}' is listed twice")
            seen.add(plain)
        return raw

    @field_validator("plugin_config", mode="before")
    @classmethod
    def _read_plugin_config(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return raw
        result = {}
        for name, options in raw.items():
            if options is None:
                options = {}
            if not isinstance(options, Mapping):
                raise FieldProblem(
                    (str(name),),
                    f"the options of plugin '{name}' must be a mapping; got {as_written(options)}",
                )
            result[name] = plain_value(options, (str(name),))
        return result

    def note_origin(self, source: str, ignored_fields: List[str], plugin_config_lines: Optional[Dict[str, int]] = None) -> None:
        """Record the file this config was read from, the cluster-only fields it dropped and the
        line of each ``plugin_config`` block (the reader's business, after validation)."""
        self._source = source
        self._ignored_fields = list(ignored_fields)
        self._plugin_config_lines = dict(plugin_config_lines or {})

    def plugin_config_location(self, plugin: str) -> str:
        """``file:line`` of ``plugin_config.<plugin>`` (the file alone when the line is unknown),
        for a plugin's own refusal of its options."""
        line = self._plugin_config_lines.get(plugin)
        return f"{self._source}:{line}" if line is not None else self._source

    @property
    def ignored_fields(self) -> List[str]:
        """Dotted paths of the cluster-only fields the file set, in file order (for one note)."""
        return list(self._ignored_fields)

    @property
    def source(self) -> str:
        """The file this came from (``"<dict>"`` for a dict), for messages that name it."""
        return self._source

    @property
    def hyperparameter_space(self) -> Optional[Dict[str, Any]]:
        """The ``hyperparameters`` block as written when it has a search space (int, double,
        log, categorical entries), else None; ``hyperparameters`` then holds trial 1's draw."""
        return copy.deepcopy(self._hyperparameter_space)

    @property
    def global_batch_size(self) -> Optional[int]:
        """``hyperparameters.global_batch_size``, if set (checked to be an int >= 1)."""
        return self.hyperparameters.get("global_batch_size")

    def trial_seed(self, trial_id: int = 1) -> int:
        """The seed of trial ``trial_id`` (1 for a local run), derived as Determined's master
        derives it from ``reproducibility.experiment_seed``.

        The master's searcher owns a Mersenne Twister seeded with the experiment seed (its
        ``nprand``, numpy's ``RandomState`` generator). Each trial it creates draws a request
        id (four 32-bit words) and then the trial seed (the next word's low 31 bits); sampling
        constant hyperparameters draws nothing. So trial ``k``'s seed is word ``5k`` of the
        stream, masked to 0..2**31-1: deterministic, and the seed that trial gets on a cluster.
        """
        if trial_id < 1:
            raise ValueError(f"trial_id counts from 1; got {trial_id}")
        if os.environ.get(TRIAL_SEED_ENV):  # a search's trial: the seed its searcher drew
            return int(os.environ[TRIAL_SEED_ENV])
        if self._hyperparameter_space is not None:
            from hookdet.search.space import MasterRandom, draw_trial

            rand = MasterRandom(self.reproducibility.experiment_seed)
            draws = [draw_trial(self._hyperparameter_space, rand) for _ in range(trial_id)]
            return draws[-1].seed
        words = _mersenne_twister_words(self.reproducibility.experiment_seed, 5 * trial_id)
        return words[-1] & MAX_EXPERIMENT_SEED

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable snapshot (for the run directory and checkpoint metadata) that
        :func:`parse_experiment_config` reads back into a config with the same fields (its
        ``source`` and ``ignored_fields`` are not part of the snapshot). Lengths are in
        Determined's ``{unit: n}`` form; cluster-only fields are not included."""
        return self.model_dump(mode="json")


#: Set by a hyperparameter search for each trial it runs: the seed Determined's master drew.
TRIAL_SEED_ENV = "HOOKDET_TRIAL_SEED"
#: Set by a hyperparameter search for each trial it runs: its number in the search, from 1.
TRIAL_ID_ENV = "HOOKDET_TRIAL_ID"
#: Set by a hyperparameter search for each segment it runs: the length, as ``"8 batches"``, at
#: whose first validation at or past it the trial pauses (checkpoints and exits 0), whatever
#: length the trial itself trains to (a script's ``Trainer.fit(max_length=...)`` included).
SEGMENT_END_ENV = "HOOKDET_SEGMENT_END"
#: Set by a hyperparameter search for each trial it runs: a file whose existence says the search
#: stopped the trial. A Core API trial is never paused at a rung (its resume is the script's):
#: its ``should_preempt()`` turns true once this file exists, and it ends as stopped.
SEARCH_STOP_FILE_ENV = "HOOKDET_SEARCH_STOP_FILE"


def current_trial_id() -> int:
    """This process's trial id: its number in the search that started it, else 1 (a local run
    is its experiment's one trial)."""
    return int(os.environ.get(TRIAL_ID_ENV) or 1)


def _mersenne_twister_words(seed: int, count: int) -> List[int]:
    """The first ``count`` 32-bit outputs of MT19937 seeded with ``init_genrand(seed)``, the
    seeding numpy's RandomState and Determined's nprand use for an integer seed."""
    state = [seed & 0xFFFFFFFF]
    for index in range(1, 624):
        previous = state[-1]
        state.append((1812433253 * (previous ^ (previous >> 30)) + index) & 0xFFFFFFFF)
    generator = random.Random()
    generator.setstate((3, tuple(state) + (624,), None))
    return [generator.getrandbits(32) for _ in range(count)]
