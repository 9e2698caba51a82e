"""The pattern library: rule model, strict loader and the bundled rules' location."""

from forensics.rules.loader import RuleError, RuleLoadError, load_rules
from forensics.rules.model import TAXONOMY, Rule

__all__ = ["TAXONOMY", "Rule", "RuleError", "RuleLoadError", "load_rules"]
