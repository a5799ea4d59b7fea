"""A few paragraphs of plain English: the training text of the tiny models' BPE tokenizers."""

CORPUS = """\
The river ran quietly past the old mill, where the wheel had not turned for many years. In the
morning the light came through the broken windows and lay in long bright bars across the floor.
Children from the village sometimes came to play among the rusted gears, and their voices echoed
under the high wooden roof. Nobody remembered exactly when the miller had left, but everyone agreed
that the bread had been better in those days.

A computer does only what it is told, one small step after another, but it does those steps very
quickly. A program is a list of such steps, written so that a person can read it and a machine can
run it. Good programs are short, clear and honest about what they do. When a program fails, the
first question is always the same: what did we expect, and what actually happened?

In spring the fields turn green again and the farmers walk out early to look at the soil. They talk
about the weather, the price of seed, and the new tractor that one of them bought last winter. The
birds return from the south, and the evenings grow longer. On Sundays the market in the square is
full of people buying cheese, apples, honey, flowers and fresh fish from the coast.

Language models read text as a sequence of tokens and learn to predict the next one. During
inference the model keeps a cache of keys and values for every token it has already seen, so that
each new token costs only a little more work. Serving many requests at once means sharing the
memory of that cache between them, in small blocks, and deciding which request should run next.

She opened the letter slowly, as if the paper might break. It was written in blue ink, in a careful
hand she did not know. "Dear friend," it began, "I am sorry that I could not write sooner. The
journey was long and the roads were bad, but we arrived safely on the third of May." Outside, the
rain had stopped, and somewhere a dog was barking at the first stars of the evening.

Numbers such as 1, 2, 3, 10, 42, 100 and 2024 appear in ordinary text; so do questions, answers,
lists, quotes, commas, colons: and semicolons; brackets (like these) and the occasional exclamation!
"""
