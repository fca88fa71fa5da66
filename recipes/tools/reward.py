"""The tool recipe's reward, in TRL's convention: completions are the episode's turns, environments its objects."""
import re


def correct_product(completions, environments, answer, **kwargs):
    out = []
    for turns, env, a in zip(completions, environments, answer):
        final = [t["content"] for t in turns if t["role"] == "assistant"][-1]  # the model's last turn
        nums = re.findall(r"-?\d+", final.replace(",", ""))
        used_tool = bool(getattr(env, "results", None))
        out.append(1.0 if nums and int(nums[-1]) == int(a) and used_tool else 0.0)
    return out
