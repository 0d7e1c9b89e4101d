"""The few exceptions iAs raises across module boundaries."""


class IasError(Exception):
    """Base class: a problem that is reported to the user as one clear line."""


class ConfigError(IasError):
    """The configuration (ias.toml or the environment) is unusable."""


class SkillError(IasError):
    """A SKILL.md could not be loaded; `problems` holds `path:line: message` lines."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class StoreError(IasError):
    """The database is unreachable or refused a statement; fail closed."""


class ClusterError(IasError):
    """The embedded PostgreSQL cluster could not be created or started."""
