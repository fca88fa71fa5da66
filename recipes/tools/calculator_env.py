"""The tool recipe's environment and reward, as plain code (TRL's environment_factory convention).

rollwise builds one CalculatorEnv per episode, calls reset(**row) with the dataset row, and offers every public
method as a tool: its name, description and parameters come from the signature and the docstring. The reward gets
the episodes' turns (completions) and their CalculatorEnv objects (environments).
"""
import re


class CalculatorEnv:
    def reset(self, **row):
        """Start an episode (row: the dataset row; nothing to add to the prompt)."""
        self.results = []

    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.results.append(a * b)
        return str(a * b)

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The first term.
            b: The second term.
        """
        self.results.append(a + b)
        return str(a + b)


def correct_answer(completions, environments, answer, **kwargs):
    """1.0 when the model's last turn ends with the right number and it used the calculator, else 0.0."""
    out = []
    for turns, env, a in zip(completions, environments, answer):
        final = [t["content"] for t in turns if t["role"] == "assistant"][-1]  # the model's last turn
        nums = re.findall(r"-?\d+", final.replace(",", ""))
        out.append(1.0 if nums and int(nums[-1]) == int(a) and env.results else 0.0)
    return out
