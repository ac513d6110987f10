"""Hyperparameter dataclasses: each field's default, valid range and help, in one place.

An algorithm declares its hyperparameters as a frozen dataclass of `Hparams` whose fields
are made by `hparam(default, valid, help)`:

    @dataclasses.dataclass(frozen=True)
    class FedZmgHparams(hparams.Hparams):
      client_learning_rate: float = hparams.client_learning_rate(0.01)
      weight_decay: float = hparams.hparam(1e-4, hparams.NON_NEGATIVE, 'Decoupled ...')

Creating one is the one validation door: every field is checked against its `Valid`
range (`ValueError` naming the hyperparameter, the allowed values and the value given,
e.g. `client_momentum must be in [0, 1), got 1.5`), then `check_together` (checks that
read several fields). The training program makes one flag per field, with the field's
help, range and per-algorithm defaults (`launch/train.py`); runs record
`dataclasses.asdict` of the resolved instance.

Hyperparameters that several families share (the learning rates, momentum, weight decay,
the GC layer choices) are made by the functions at the end of this module, so that their
range and help are written once and each family gives only its default.
"""

from collections.abc import Callable, Mapping
import dataclasses
import typing
from typing import Any, ClassVar, Optional, TypeVar

from tff_zmg import validation

_H = TypeVar('_H', bound='Hparams')


@dataclasses.dataclass(frozen=True)
class Valid:
  """The values a hyperparameter may take.

  Attributes:
    text: The values in words, as the error messages say them (e.g. 'in [0, 1)').
    check: `check(name, value) -> value` (normalized, e.g. an int 1 to 1.0), or raises
      `ValueError` with one line `'<name> must be <text>, got <value!r>'`.
  """

  text: str
  check: Callable[[str, Any], Any]


POSITIVE = Valid('> 0', validation.check_positive)
NON_NEGATIVE = Valid('>= 0', validation.check_non_negative)
BOOL = Valid('True or False', validation.check_bool)


def in_range(
    low: float, high: float, *, low_inclusive: bool = True, high_inclusive: bool = True
) -> Valid:
  """A closed interval, or one open at `low` and/or `high` (`(0, 1)`, `[0, 1)`)."""
  text = (
      f'in {"[" if low_inclusive else "("}{low:g}, {high:g}{"]" if high_inclusive else ")"}'
  )
  return Valid(
      text,
      lambda name, value: validation.check_in_range(
          name, value, low, high, low_inclusive=low_inclusive,
          high_inclusive=high_inclusive,
      ),
  )


UNIT_INTERVAL_HALF_OPEN = in_range(0.0, 1.0, high_inclusive=False)
UNIT_INTERVAL_OPEN = in_range(0.0, 1.0, low_inclusive=False, high_inclusive=False)


def integer(minimum: int, maximum: Optional[int] = None) -> Valid:
  """An integer (not a bool) `>= minimum`, and `<= maximum` if given."""
  if maximum is None:
    return Valid(
        f'an integer >= {minimum}',
        lambda name, value: validation.check_integer(name, value, minimum),
    )
  text = f'an integer in [{minimum}, {maximum}]'

  def check(name, value):
    try:
      number = validation.check_integer(name, value, minimum)
    except ValueError:
      number = None
    if number is None or number > maximum:  # One message for both ends.
      raise ValueError(f'{name} must be {text}, got {value!r}')
    return number

  return Valid(text, check)


def one_of(*choices: str) -> Valid:
  def check(name, value):
    if value not in choices:
      raise ValueError(f'{name} must be one of {list(choices)}, got {value!r}')
    return value

  return Valid(f'one of {list(choices)}', check)


def optional(valid: Valid) -> Valid:
  """`valid`, or None (unset)."""
  return Valid(
      f'unset or {valid.text}',
      lambda name, value: None if value is None else valid.check(name, value),
  )


def hparam(default: Any, valid: Valid, help: str) -> Any:  # pylint: disable=redefined-builtin
  """A field of an `Hparams` dataclass.

  Args:
    default: The default value (checked when the class is first instantiated).
    valid: The values allowed.
    help: One sentence for `--help`, without the range (added from `valid`).
  """
  return dataclasses.field(default=default, metadata={'valid': valid, 'help': help})


@dataclasses.dataclass(frozen=True)
class Hparams:
  """Base class of the hyperparameter dataclasses (see the module docstring).

  Two class attributes say how a family's client takes the SGD a paper trains every
  method with (`launch/papers`' protocols: momentum and weight decay): the name of its
  weight decay when it is not `weight_decay` (FedGPS's `lambda3`, a term of its
  objective), and whether that decay is decoupled (FedZMG's, applied to the weights
  beside the step) rather than coupled L2 (added to the gradient, inside the momentum).
  """

  WEIGHT_DECAY_NAME: ClassVar[str] = 'weight_decay'
  DECOUPLED_WEIGHT_DECAY: ClassVar[bool] = False

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = field.metadata['valid'].check(field.name, getattr(self, field.name))
      object.__setattr__(self, field.name, value)
    self.check_together()

  def check_together(self) -> None:
    """Checks that read several fields; raises `ValueError` (one line)."""

  @classmethod
  def names(cls) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))

  @classmethod
  def create(cls: type[_H], hparams: Optional[_H] = None, **overrides: Any) -> _H:
    """`hparams` (default: the defaults) with `overrides`, checked.

    Raises:
      ValueError: If a name in `overrides` is not a field, or a value is out of range.
    """
    if hparams is None:
      hparams = cls()
    elif not isinstance(hparams, cls):
      raise ValueError(f'hparams must be a {cls.__name__}, got {hparams!r}')
    unknown = sorted(set(overrides) - set(cls.names()))
    if unknown:
      raise ValueError(
          f'{unknown} are not hyperparameters of {cls.__name__}; its hyperparameters'
          f' are {sorted(cls.names())}'
      )
    return dataclasses.replace(hparams, **overrides) if overrides else hparams

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def field_info(cls: type[Hparams]) -> Mapping[str, tuple[type, Valid, str]]:
  """`{name: (type, valid, help)}` of `cls`'s fields; `type` without `Optional`."""
  hints = typing.get_type_hints(cls)
  info = {}
  for field in dataclasses.fields(cls):
    kind = hints[field.name]
    if typing.get_origin(kind) is typing.Union:  # Optional[X]: X.
      kind, = [t for t in typing.get_args(kind) if t is not type(None)]
    info[field.name] = (kind, field.metadata['valid'], field.metadata['help'])
  return info


# The hyperparameters several families share: range and help here, default per family.


def client_learning_rate(default: float) -> Any:
  return hparam(default, POSITIVE, 'Client learning rate eta_l.')


def server_learning_rate(default: float) -> Any:
  return hparam(
      default, POSITIVE,
      'Server learning rate eta_g (for FedRKMGC the relaxation rho plays its part).',
  )


def client_momentum(default: float) -> Any:
  return hparam(default, UNIT_INTERVAL_HALF_OPEN, 'Client momentum mu (0: plain SGD).')


def weight_decay(default: float) -> Any:
  return hparam(
      default, NON_NEGATIVE,
      'Client weight decay: decoupled for the FedZMG family (w <- w - eta_l wd w beside'
      ' the step), coupled L2 for the others (wd w added to the gradient, as'
      ' torch.optim.SGD).',
  )


def center_vectors(default: bool) -> Any:
  return hparam(
      default, BOOL,
      "Also centre the projected layers' bias vectors (the GC-Fed authors' code does).",
  )


def gc_lambda(default: Optional[float]) -> Any:
  return hparam(
      default, optional(in_range(0.0, 1.0)),
      'GC-Fed layer borderline lambda: the first floor(lambda * L) of the L layers are'
      ' feature layers, the rest classifier layers; unset: all layers but the last are'
      ' feature layers.',
  )


def local_gc_layers(default: str) -> Any:
  return hparam(default, one_of('all', 'feature'), 'Layers LocalGC projects.')


def global_gc_layers(default: str) -> Any:
  return hparam(default, one_of('classifier', 'all'), 'Layers Global GC projects.')
