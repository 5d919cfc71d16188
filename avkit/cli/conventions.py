"""One set of command-line conventions for every `avkit` command, applied where the commands are
looked up (so `avkit ...` and typer's CliRunner see the same thing):

  help        `-h` and `--help`; option values shown as INT, FLOAT, TEXT, PATH (never Python types such
              as `<bool>` or `<list[Path]>`); flags show no value at all
  names       one name per concept: `-k` wherever K is set, `--max-new-tokens` for the cap on generated
              tokens, `--concurrency` for requests decoding at once, `--policy` (repeatable) for verify
              policies, a positional `TRACE...` for trace files
  renamed     the old spellings still work, hidden from help, with one warning line (DEPRECATED)
"""

from __future__ import annotations

import sys

from typer.core import TyperOption

# command -> old option -> (new option, parameter name): accepted, hidden, and warned about
DEPRECATED: dict[str, dict[str, tuple[str, str]]] = {
    "serve": {"--max-tokens-limit": ("--max-new-tokens", "max_new_tokens"),
              "--max-concurrency": ("--concurrency", "concurrency")},
    "profile": {"--max-tokens": ("--max-verify-tokens", "max_verify_tokens")},
    "simulate": {"--policies": ("--policy", "policy")},
}


def _metavar(param) -> str:
    desc = param.type_descriptor  # typer's record of the annotation
    annotation = desc.annotation
    if desc.is_path:
        return "PATH"
    if annotation is int:
        return "INT"
    if annotation is float:
        return "FLOAT"
    return "TEXT"


def _alias(old: str, new: str, dest: str):
    """An eager hidden option `old` that hands its value to `dest` through the context's default map
    (what a parameter not given on the command line reads), after one warning line."""
    def forward(ctx, _param, value):
        if value is None or value == () or value == [] or ctx.resilient_parsing:  # not given
            return
        print(f"avkit: warning: {old} is deprecated; use {new}", file=sys.stderr)
        current = ctx.default_map or {}
        if isinstance(value, tuple):  # a repeatable option: the new one is a list
            value = list(value)
        ctx.default_map = {**current, dest: value}
    return forward


def _plain_help_option(cmd) -> None:
    """-h/--help is made per context by the command: show it without a value type too."""
    make = cmd.get_help_option

    def get_help_option(ctx):
        option = make(ctx)
        if option is not None:
            option.metavar = ""
        return option
    cmd.get_help_option = get_help_option


def apply(cmd, name: str):
    """Apply the conventions to one command (idempotent); groups recurse into their commands."""
    if getattr(cmd, "_avkit_conventions", False):
        return cmd
    for sub_name, sub in getattr(cmd, "commands", {}).items():  # a group: its commands too
        apply(sub, sub_name)
    for p in cmd.params:
        if getattr(p, "is_flag", False):
            p.metavar = ""  # a flag takes no value: show none
        elif getattr(p, "param_type_name", "") == "argument":
            p.display_type_rich = lambda ctx: None  # the argument's name says what it is
        elif p.metavar is None and hasattr(p, "type_descriptor"):
            p.metavar = _metavar(p)
    _plain_help_option(cmd)
    params = {p.name: p for p in cmd.params}
    for old, (new, dest) in DEPRECATED.get(name, {}).items():
        target = params.get(dest)
        if target is None:
            continue
        cmd.params.append(TyperOption(param_decls=[old], type_descriptor=target.type_descriptor, hidden=True,
                                      expose_value=False, is_eager=True, multiple=target.multiple,
                                      callback=_alias(old, new, dest)))
    cmd._avkit_conventions = True
    return cmd


__all__ = ["DEPRECATED", "apply"]
