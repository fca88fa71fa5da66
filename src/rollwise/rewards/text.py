"""Linear-time pieces of answer extraction that a regex would do in quadratic time on hostile text.

`<answer>(.*?)</answer>` looks harmless, but on a completion holding thousands of `<answer>` tags and no
closing one, every tag scans to the end of the text before failing: 40k characters held a scorer for seconds
(and the GIL with it). These helpers use `str.find`, so each character is looked at a bounded number of times.
"""

from __future__ import annotations


def tag_contents(text: str, open_tag: str, close_tag: str, *, to_end: bool = False) -> list[str]:
    """What `re.findall(open + "(.*?)" + close, text, re.DOTALL)` returns, in linear time.

    to_end: an unclosed last tag runs to the end of the text, as `(?:close|$)` would (a trailing newline is
    left out, as `$` stops before it)."""
    out: list[str] = []
    pos = 0
    while True:
        i = text.find(open_tag, pos)
        if i < 0:
            return out
        start = i + len(open_tag)
        j = text.find(close_tag, start)
        if j < 0:
            if to_end:
                out.append(text[start:-1] if text.endswith("\n") and len(text) > start else text[start:])
            return out
        out.append(text[start:j])
        pos = j + len(close_tag)


def fenced_code(text: str, tags: tuple[str, ...] = ("python", "py")) -> str | None:
    """The body of the first ```` ```python ```` fenced block (what ```` ```(?:python|py)?\\s*\\n(.*?)``` ````
    finds with DOTALL), or None when there is none; linear time."""
    n = len(text)
    pos = 0
    while True:
        i = text.find("```", pos)
        if i < 0:
            return None
        for tag in (*tags, ""):  # the regex's alternation order
            j = i + 3
            if tag:
                if not text.startswith(tag, j):
                    continue
                j += len(tag)
            k = j
            while k < n and text[k].isspace():
                k += 1
            nl = text.rfind("\n", j, k)  # \s*\n: the body starts after the last newline of the whitespace run
            if nl < 0:
                continue
            end = text.find("```", nl + 1)
            if end < 0:
                return None  # no closing fence after this one, so none after any later one either
            return text[nl + 1 : end]
        pos = i + 1
