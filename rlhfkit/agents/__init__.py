"""Agents: multi-turn episodes with tools and environments (TRL's ``tools=`` and
``environment_factory=``), token in and token out."""

from .calls import CallResult, run_tool_calls
from .episode import AgentOptions, Episode, run_episodes, start_episode
from .parsing import MalformedToolCall, parse_tool_calls
from .rows import episodes_rollout
from .templates import check_agent_template, rewrites_history, tool_suffix
from .tools import Tool, check_environment_factory, environment_tools, make_tool, make_tools

__all__ = [
    "AgentOptions",
    "Episode",
    "episodes_rollout",
    "run_episodes",
    "start_episode",
    "MalformedToolCall",
    "parse_tool_calls",
    "check_agent_template",
    "rewrites_history",
    "tool_suffix",
    "Tool",
    "check_environment_factory",
    "environment_tools",
    "make_tool",
    "make_tools",
    "run_tool_calls",
    "CallResult",
]
