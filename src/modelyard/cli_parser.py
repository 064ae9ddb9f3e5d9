"""The argument parser every ``modelyard`` command uses: a mistyped flag gets a suggestion.

``modelyard convert x --quantise dynamic`` ends with "did you mean --quantize?"; a mistyped
choice or subcommand (``--quantize dynamik``, ``modelyard serv``) names the closest one too. Subparsers
made by ``add_subparsers`` take their parent's class, so building the top-level parser
with this class covers every subcommand, ``serve`` included.
"""
from __future__ import annotations

import argparse
import difflib
import sys

# difflib's default 0.6 lets unrelated short flags match each other; 0.7 still catches one
# wrong, missing or swapped letter, and the dash/underscore spellings of a flag.
_CUTOFF = 0.7


def _flag_part(arg: str) -> str:
    return arg.split("=", 1)[0]


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but an epilog starting ``examples:`` keeps its lines as written (the
    description is still wrapped to the terminal)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def examples(*lines: str) -> str:
    """An ``epilog`` of example command lines, shown as written under the options."""
    return "examples:\n" + "".join(f"  {line}\n" for line in lines)


class SuggestingArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that names the closest known flag for each unknown one.

    A parser with ``dash_spellings = True`` (``serve``, whose flags keep TF Serving's
    underscores) also takes ``--model-base-path`` for ``--model_base_path``.
    """

    dash_spellings = False

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def _respelled(self, args: list[str]) -> list[str]:
        """``args`` with each dashed spelling of a known underscore flag replaced by the flag."""
        known = set(self.option_strings())
        out = []
        for i, arg in enumerate(args):
            if arg == "--":  # what follows belongs to someone else
                return out + args[i:]
            flag, sep, value = arg.partition("=")
            underscored = "--" + flag[2:].replace("-", "_")
            if flag.startswith("--") and flag not in known and underscored in known:
                arg = underscored + sep + value
            out.append(arg)
        return out

    def option_strings(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings if s.startswith("--")]

    def suggest(self, unknown: str) -> str | None:
        """The known long flag closest to ``unknown``, or None when nothing is close."""
        if not unknown.startswith("--"):
            return None
        candidates = self.option_strings()
        flag = _flag_part(unknown)
        normalised = {c.replace("-", "_"): c for c in candidates}
        if flag.replace("-", "_") in normalised:
            return normalised[flag.replace("-", "_")]
        close = difflib.get_close_matches(flag, candidates, n=1, cutoff=_CUTOFF)
        return close[0] if close else None

    def hints(self, args: list[str]) -> list[tuple[str, str]]:
        """(mistyped flag, the known flag closest to it) for each unknown long flag of ``args``."""
        known = set(self.option_strings())
        flags = []
        for arg in args:
            if arg == "--":  # what follows belongs to someone else
                break
            flag = _flag_part(arg)
            # argparse takes a unique prefix of a flag (allow_abbrev) as the flag: not a typo.
            abbreviates = self.allow_abbrev and len([k for k in known if k.startswith(flag)]) == 1
            if arg.startswith("--") and flag not in known and not abbreviates:
                flags.append(arg)
        return [(arg, hint) for arg in flags for hint in [self.suggest(arg)] if hint]

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        if self.dash_spellings:
            args = self._respelled(args)
        # Kept for error(): argparse may stop before it lists the unknown flags (a required flag missing,
        # as `--modle` leaves --model), and the typo is then the reason to name.
        self._parsing = args
        namespace, extras = super().parse_known_args(args, namespace)
        if self.hints(extras):
            # Raised here, in the (sub)parser that knows the flags, so the usage line printed
            # is the subcommand's; unknown args with no close flag go up to argparse's message.
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str):
        """argparse's error, with "did you mean" for each mistyped flag of the arguments being parsed."""
        hints = self.hints(getattr(self, "_parsing", []))
        if hints:
            message += " (" + "; ".join(f"{_flag_part(arg)}: did you mean {hint}?" for arg, hint in hints) + ")"
        super().error(message)

    def _check_value(self, action, value):
        # argparse's own check, with the closest choice added to its "invalid choice" message.
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            choices = [str(c) for c in action.choices or ()]
            close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
            if not close:
                raise
            raise argparse.ArgumentError(action, f"{exc.message}; did you mean {close[0]}?") from None
