"""An OpenAI-compatible chat-completions endpoint on a rollout engine (``server.Endpoint``), served
by the policy during RL for ``RLTrainer(agent_program=fn)`` (``program``) and by ``rlhfkit serve``
(``serve``). Every request is rendered with the trainer's chat template and recorded token for
token (``record``); an episode's training rows come from those ids, never from re-tokenised text."""

from .program import AgentProgram, ProgramAgent, ProgramResult, agent_program
from .protocol import BadRequest, parse_request
from .server import Endpoint

__all__ = ["AgentProgram", "BadRequest", "Endpoint", "ProgramAgent", "ProgramResult", "agent_program", "parse_request"]
