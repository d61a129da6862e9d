#!/usr/bin/env python3
# Writes the byte-level training corpus for the tiny GPT (models/tiny_gpt/corpus.txt).
# Plain Python, no dependencies: `python3 models/make_corpus.py`.
# The text is English-like prose from a small hand-written grammar, drawn with
# random.Random(1234), so every run writes byte-identical ASCII (about 48 KiB).
import argparse
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_BYTES = 48 * 1024
SEED = 1234

# Word lists. Subjects and objects are singular nouns; verbs are past tense so any
# subject can take any verb without agreement rules.
SUBJECTS = [
    "miller", "baker", "old sailor", "young clerk", "gardener", "weaver", "shepherd",
    "teacher", "fox", "heron", "tired horse", "small dog", "lantern maker", "ferryman",
    "potter", "scribe", "cook", "tailor", "beekeeper", "night watchman", "grey cat",
    "blacksmith", "river otter", "traveller", "mapmaker", "carpenter",
]
NAMES = [
    "Ada", "Bram", "Clara", "Dov", "Elsie", "Finn", "Greta", "Hugo", "Ines", "Jonas",
    "Kira", "Lev", "Mara", "Nils", "Orla", "Pavel", "Rosa", "Tomas", "Una", "Viggo",
]
VERBS = [
    "carried", "painted", "mended", "found", "lost", "opened", "counted", "cleaned",
    "hid", "sold", "bought", "weighed", "watched", "followed", "dropped", "lifted",
    "wrapped", "polished", "buried", "borrowed", "returned", "measured", "sketched",
]
INTRANSITIVE = [
    "laughed", "waited", "slept", "sang", "wandered", "rested", "shivered", "hurried",
    "listened", "whistled", "sighed", "stumbled", "paused",
]
BASE_VERBS = {  # for questions: "Did the cook ... ?"
    "carried": "carry", "painted": "paint", "mended": "mend", "found": "find",
    "lost": "lose", "opened": "open", "counted": "count", "cleaned": "clean",
    "hid": "hide", "sold": "sell", "bought": "buy", "weighed": "weigh",
    "watched": "watch", "followed": "follow", "dropped": "drop", "lifted": "lift",
    "wrapped": "wrap", "polished": "polish", "buried": "bury", "borrowed": "borrow",
    "returned": "return", "measured": "measure", "sketched": "sketch",
}
OBJECTS = [
    "basket", "lamp", "letter", "kettle", "wheel", "rope", "blanket", "map", "bell",
    "ladder", "jar of honey", "copper coin", "wooden box", "loaf", "net", "compass",
    "spoon", "ribbon", "bucket", "key", "candle", "book of songs", "pair of boots",
    "clock", "stone", "feather",
]
PLURALS = [
    "baskets", "lamps", "letters", "barrels", "geese", "sheep", "candles", "apples",
    "boats", "chairs", "coins", "bells",
]
ADJECTIVES = [
    "red", "quiet", "heavy", "narrow", "bright", "cold", "crooked", "gentle", "broken",
    "green", "shiny", "dusty", "tall", "round", "sleepy", "curious", "patient", "clever",
    "brave", "little", "ancient", "soft", "wet", "golden",
]
ADVERBS = [
    "slowly", "quickly", "carefully", "softly", "twice", "again", "at once", "happily",
    "without a word", "in silence", "all day", "before noon",
]
PLACES = [
    "near the mill", "by the river", "in the market", "under the bridge",
    "behind the barn", "on the hill", "at the harbour", "inside the tower",
    "across the square", "beside the well", "in the orchard", "along the canal",
    "past the chapel", "under the old oak", "at the edge of the forest", "in the kitchen",
]
TIMES = [
    "In the morning", "At dusk", "Before the rain", "After supper", "On Sunday",
    "Late that night", "At first light", "During the fair", "Every winter", "Once",
]
SPEECH_VERBS = ["said", "asked", "called", "whispered", "replied", "shouted"]
EXCLAMATIONS = ["Look at that", "What a day", "Hurry up", "Not again", "How lovely",
                "Wait for me", "Well done"]
CONNECTIVES = ["and then", "but", "so", "while"]


class Grammar:
    """Sentence templates over the word lists above, driven by one seeded generator."""

    def __init__(self, rng):
        self.rng = rng

    def pick(self, words):
        return self.rng.choice(words)

    def noun_phrase(self, nouns):
        # "the cook", "the red cook", "a heavy basket"; roughly half get an adjective.
        article = "the" if self.rng.random() < 0.7 else "a"
        if self.rng.random() < 0.5:
            phrase = f"{self.pick(ADJECTIVES)} {self.pick(nouns)}"
        else:
            phrase = self.pick(nouns)
        if article == "a" and phrase[0] in "aeiou":
            article = "an"
        return f"{article} {phrase}"

    def agent(self):
        return self.pick(NAMES) if self.rng.random() < 0.3 else self.noun_phrase(SUBJECTS)

    def clause(self):
        who = self.agent()
        if self.rng.random() < 0.25:
            return f"{who} {self.pick(INTRANSITIVE)} {self.pick(PLACES)}"
        tail = ""
        roll = self.rng.random()
        if roll < 0.4:
            tail = f" {self.pick(PLACES)}"
        elif roll < 0.6:
            tail = f" {self.pick(ADVERBS)}"
        return f"{who} {self.pick(VERBS)} {self.noun_phrase(OBJECTS)}{tail}"

    def sentence(self):
        roll = self.rng.random()
        if roll < 0.35:
            text = self.clause() + "."
        elif roll < 0.50:
            text = f"{self.pick(TIMES)}, {self.clause()}."
        elif roll < 0.65:
            text = f"{self.clause()}, {self.pick(CONNECTIVES)} {self.clause()}."
        elif roll < 0.75:
            verb = BASE_VERBS[self.pick(VERBS)]
            text = f"Did {self.agent()} {verb} {self.noun_phrase(OBJECTS)} {self.pick(PLACES)}?"
        elif roll < 0.85:
            said = self.pick(SPEECH_VERBS)
            text = f"\"{self.pick(EXCLAMATIONS)}!\" {said} {self.agent()}."
        elif roll < 0.93:
            count = self.rng.randint(2, 12)
            text = (f"There were {count} {self.pick(PLURALS)} {self.pick(PLACES)}; "
                    f"{self.clause()}.")
        else:
            text = f"{self.agent()} {self.pick(INTRANSITIVE)} ({self.pick(ADVERBS)})."
        return text[0].upper() + text[1:]

    def paragraph(self):
        # Three to six sentences on one line, so newlines come every few sentences.
        return " ".join(self.sentence() for _ in range(self.rng.randint(3, 6)))


def make_corpus(target_bytes=TARGET_BYTES, seed=SEED):
    grammar = Grammar(random.Random(seed))
    parts, size = [], 0
    while size < target_bytes:
        para = grammar.paragraph() + "\n"
        if grammar.rng.random() < 0.25:
            para += "\n"  # an occasional blank line between paragraphs
        parts.append(para)
        size += len(para)
    text = "".join(parts)
    return text.encode("ascii")


def main():
    parser = argparse.ArgumentParser(description="Writes the tiny GPT training corpus.")
    parser.add_argument("-o", "--out", default=os.path.join(HERE, "tiny_gpt", "corpus.txt"))
    args = parser.parse_args()
    data = make_corpus()
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {len(data)} bytes to {args.out}")


if __name__ == "__main__":
    main()
