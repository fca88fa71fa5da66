"""The tool recipe's environment: a calculator, as a plain class (TRL's environment_factory shape).

rollwise builds one instance per episode, calls reset(**row) with the dataset row, and offers every public method
as a tool: its name, description and parameters come from the signature and the docstring.
"""


class CalculatorEnv:
    def reset(self, **row):
        """Start an episode (row: the dataset row; nothing to add to the prompt)."""
        self.results = []
        return None

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
