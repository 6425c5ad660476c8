"""spec_bench_prompts: the conversations tools/bench_speculative.py runs, as chat
messages (the model's chat template turns them into token ids), one list per task:

grounded  rewrite, summarize or correct a given passage of a few hundred tokens: the
          answer naturally copies spans of the prompt (prompt lookup pays);
agent     one agent-style session: the assistant answers each turn with a JSON tool
          call, the tool's JSON result is appended, and the next request carries every
          earlier turn; the requests run in order, so a proposer that remembers earlier
          outputs (suffix decoding's global cache) can reuse them;
chat      open creative questions: little to copy (speculation's overhead shows).

The passages and the session are written for this benchmark (no data set needed).
"""
from __future__ import annotations

import json

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# -- grounded: (instruction, passage) ---------------------------------------------------

_PASSAGES = [
    ("Rewrite the following passage in simpler words. Keep every name, date and number.",
     "The municipal water authority of Port Aldine was founded in 1898, after a cholera "
     "outbreak killed more than four hundred residents in the harbour district. Its first "
     "engineer, Margaret Oyelaran, designed a system of slow sand filters fed by the Keller "
     "reservoir, twelve kilometres north of the city. The filters were housed in three brick "
     "buildings on Mill Street, each holding eight filter beds that could be cleaned one at a "
     "time without stopping the supply. By 1910 the authority served forty thousand homes, and "
     "deaths from waterborne disease had fallen by ninety per cent. In 1936 a second reservoir "
     "was built at Hollin Cross to keep up with the growing suburbs, and the Mill Street "
     "buildings were fitted with electric pumps that replaced the original steam engines. "
     "The authority added chlorination in 1948 and fluoridation in 1962, the latter after a "
     "public vote that passed by a margin of only six hundred ballots. Today the Mill Street "
     "buildings are a museum, and the Keller reservoir is a nature reserve that attracts "
     "around sixty thousand visitors each year. The authority itself was merged into the "
     "regional utility in 1994, but its emblem, a heron standing in reeds, still appears on "
     "the manhole covers throughout the old city."),
    ("Summarize the following passage in a few sentences.",
     "Honeybee colonies regulate the temperature of their brood nest with remarkable "
     "precision. The developing larvae and pupae must be kept between thirty-four and "
     "thirty-six degrees Celsius; outside that range, the adult bees that emerge show poorer "
     "learning and shorter lives. When the nest is too cold, worker bees cluster over the "
     "brood cells and shiver their flight muscles without moving their wings, producing heat. "
     "Some workers even squeeze into empty cells among the brood, warming several neighbours "
     "at once. When the nest is too warm, the workers do the opposite: they spread out, fan "
     "their wings at the entrance to drive air through the hive, and carry water droplets "
     "that cool the comb as they evaporate. Research by Jürgen Tautz and colleagues showed "
     "that colonies with many genetically different fathers keep a steadier temperature than "
     "colonies with one father, because workers from different lines start fanning or "
     "shivering at slightly different thresholds. The colony therefore responds gradually "
     "rather than all at once, which avoids overshooting. Beekeepers have long noticed that "
     "a strong colony hums at a steady pitch on a summer evening; that sound is largely the "
     "noise of thousands of bees fanning in shifts to hold the nest at the right temperature."),
    ("Rewrite the following meeting notes as a short formal email to the team. Keep all the "
     "decisions, names and dates.",
     "Meeting notes, planning for the spring release, Tuesday 4 March. Present: Priya, "
     "Tomasz, Elena, Kofi, Mariana. Priya opened with the status of the billing rewrite: the "
     "new invoice service is feature complete, but the migration script still fails on "
     "accounts created before 2019 because their tax codes are stored as free text. Tomasz "
     "will write a cleanup job for those accounts by 14 March. Elena reported that the mobile "
     "app crash rate fell from 1.8 per cent to 0.6 per cent after the image cache fix, and "
     "asked whether the fix can ship to all users rather than the ten per cent test group; "
     "agreed, rollout to everyone on 11 March. Kofi raised the support backlog: 312 open "
     "tickets, of which 140 are about password resets. Decision: Mariana will add a self "
     "service reset page, target date 21 March, and Kofi will draft a help article in the "
     "meantime. The release itself stays on 1 April. Risks: the billing migration, if the "
     "cleanup job slips, and the app store review, which took nine days last time. Next "
     "meeting Tuesday 11 March, same time, with the billing migration as the first item."),
    ("Correct the spelling and grammar of the following text and return the whole corrected "
     "text.",
     "The old lighthouse on Carrow Point were built in 1852 and it's light could be seen "
     "for twenty miles out to sea. The first keeper, a man called Ewan Tolley, lived their "
     "with his wife and there four children for thirty one years. Every evening he climbed "
     "the hundred and twelve steps to lit the lamp, and every morning he climbed them again "
     "to trim the wick and clean the lens, which was made in Paris and weighed nearly two "
     "tonnes. In the great storm of 1877 the waves broke over the gallery and smashed one of "
     "the windows, but Tolley keeped the light burning all night by standing in front of the "
     "broken pane with a tarpaulin. A ship called the Margery Anne, which was carrying coal "
     "from Newcastle, later reported that the light was the only thing that kept them off "
     "the rocks. The lighthouse was automated in 1964 and the keepers cottage is now a small "
     "museum, where visitors can sea the logbooks that Tolley kept, writen in a neat hand and "
     "full of notes about the whether, the ships that past and the birds that nested on the "
     "cliffs below."),
]


def grounded() -> list[list[dict]]:
    return [[{"role": "system", "content": SYSTEM},
             {"role": "user", "content": f"{instruction}\n\n{passage}"}]
            for instruction, passage in _PASSAGES]


# -- agent: one session, a request per turn ---------------------------------------------

_AGENT_SYSTEM = (
    "You are an inventory agent. You can call these tools:\n"
    '- get_stock: {"item": string} returns the units in stock\n'
    '- reorder: {"item": string, "units": integer} places an order\n'
    "To call a tool, reply with exactly one JSON object of the form "
    '{"tool": "<name>", "arguments": {...}} and nothing else. Check every item the user '
    "lists, one call per turn, and reorder up to 50 units of any item below 20 units.")
_AGENT_USER = ("Check the stock of these items and reorder whatever is low: widgets, gaskets, "
               "bolts, hinges, brackets, springs.")
# (tool call, its result): the session so far, as an agent would have run it
_AGENT_TURNS = [
    ({"tool": "get_stock", "arguments": {"item": "widgets"}}, {"item": "widgets", "units": 42}),
    ({"tool": "get_stock", "arguments": {"item": "gaskets"}}, {"item": "gaskets", "units": 7}),
    ({"tool": "reorder", "arguments": {"item": "gaskets", "units": 43}},
     {"item": "gaskets", "ordered": 43, "status": "ok"}),
    ({"tool": "get_stock", "arguments": {"item": "bolts"}}, {"item": "bolts", "units": 128}),
    ({"tool": "get_stock", "arguments": {"item": "hinges"}}, {"item": "hinges", "units": 15}),
    ({"tool": "reorder", "arguments": {"item": "hinges", "units": 35}},
     {"item": "hinges", "ordered": 35, "status": "ok"}),
    ({"tool": "get_stock", "arguments": {"item": "brackets"}}, {"item": "brackets", "units": 61}),
]


def agent() -> list[list[dict]]:
    """The session's requests in order: request i carries the first i turns."""
    requests = []
    history = [{"role": "system", "content": _AGENT_SYSTEM},
               {"role": "user", "content": _AGENT_USER}]
    for call, result in _AGENT_TURNS:
        requests.append(list(history))
        history += [{"role": "assistant", "content": json.dumps(call)},
                    {"role": "tool", "content": json.dumps(result)}]
    requests.append(list(history))
    return requests


# -- chat: open questions ---------------------------------------------------------------

_QUESTIONS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Invent a new holiday and describe how people celebrate it.",
    "What would a city designed by cats look like? Describe it.",
    "Write a poem about the first snow of winter.",
]


def chat() -> list[list[dict]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
            for q in _QUESTIONS]


TASKS = {"grounded": grounded, "agent": agent, "chat": chat}
