"""One OpenAI Agents SDK session (chat completions) with a shell tool, run by test_agent_clis.py as its
own process: OPENAI_BASE_URL, MODEL. Prints the final answer."""

from __future__ import annotations

import asyncio
import os
import subprocess

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

@function_tool
def run_shell_command(command: str) -> str:
    """Run a shell command in the working directory and return what it printed."""
    out = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def main() -> None:
    set_tracing_disabled(True)  # nothing leaves the machine
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="demo", max_retries=0)
    agent = Agent(name="lister", instructions="You are a coding agent. Use the shell to look around.",
                  tools=[run_shell_command], model=OpenAIChatCompletionsModel(model=os.environ["MODEL"],
                                                                              openai_client=client))
    result = asyncio.run(Runner.run(agent, "List the files here, then say done."))
    print(result.final_output)


if __name__ == "__main__":
    main()
