"""The vocabularies and task templates of the version-2 instruction sources (sources.py): the
kinds of request an assistant gets that version 1 lacked or had only as topic templates, namely
translation, tone rewriting, reading comprehension and summaries of short narrative paragraphs,
reading code, everyday how-to and why questions, multi-step word problems, structured output
(JSON, lists, tables), stories and messages. The version-3 section holds the wordings of the
open-vocabulary requests (sources.py fills them from lexicon.py's words and sentences); the
version-4 section, the wordings that cross version 2's kinds of request (code, structured output,
lists) with that vocabulary.

Boundary: text only, no model, no generators (sources.py draws from these lists), no dev or demo
prompts; the wording also stays apart from the development prompts' phrasings, so that the
development set still measures what carries over to unseen wordings. Appending to a list
changes the stream of that version: bump sources.VERSION, never edit in place what a committed shard's
stream version used.
"""
from __future__ import annotations

NAMES = ["Anna", "Ben", "Carlos", "Dina", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jamal",
         "Keiko", "Leo", "Maya", "Nikolai", "Olga", "Pedro", "Rosa", "Sven", "Tara", "Yusuf"]
CITIES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Lima", "Hanoi", "Oslo", "Porto",
          "Cape Town", "Melbourne", "Seville", "Bergen", "Valparaiso", "Kyoto", "Edinburgh"]

# -- translation ------------------------------------------------------------------------------
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Chinese",
             "Japanese", "Korean", "Russian", "Turkish", "Polish", "Swedish", "Arabic"]
TRANSLATE = ["Give the {lang} translation of this sentence: {s}",
             "Translate this sentence into {lang}:\n\n{s}",
             "How do you say \"{s}\" in {lang}?", "Please translate the following into {lang} "
             "and explain any word that is hard to translate: {s}",
             "Translate into {lang}, then back into English: {s}"]
SENTENCES = [
    "I would like a cup of {drink}, please.", "The {place} opens at {hour} o'clock.",
    "My {relative} lives in {city}.", "Could you tell me where the {place} is?",
    "We are going to the {place} {when}.", "I have lost my {object}.",
    "It is very {weather} today.", "How much does this {object} cost?",
    "I am learning to {hobby}.", "See you at the {place} {when}!",
    "Thank you for your help with the {chore}.", "The train to {city} leaves in {n} minutes.",
    "My {relative} and I like to {hobby} on weekends.", "Where can I buy a {object}?",
    "I have been living in {city} for {n} years.", "Excuse me, is this seat free?",
    "Please wait here, the {place} is closed {when}.", "Do you know a good {place} near here?",
]
FILL = {
    "drink": ["tea", "coffee", "hot chocolate", "orange juice", "water", "lemonade"],
    "place": ["library", "bakery", "museum", "train station", "pharmacy", "post office",
              "swimming pool", "market", "hospital", "restaurant", "park", "bookshop"],
    "hour": ["seven", "eight", "nine", "ten", "eleven"],
    "relative": ["sister", "brother", "grandmother", "uncle", "cousin", "best friend"],
    "when": ["tomorrow", "this evening", "next week", "on Saturday", "after lunch"],
    "object": ["umbrella", "wallet", "phone", "jacket", "bicycle", "watch", "notebook", "key"],
    "weather": ["cold", "hot", "windy", "sunny", "rainy", "foggy"],
    "hobby": ["swim", "play the guitar", "cook", "paint", "dance", "speak a new language"],
    "chore": ["move", "garden", "homework", "presentation", "cooking", "repairs"],
}

# -- tone rewriting ---------------------------------------------------------------------------
INFORMAL = [
    "hi can u {req} today?", "gonna be late for the {event}, sorry!!", "thx for the {gift}, "
    "it was awesome", "pls dont forget to {req} tmrw", "yo, r u coming to the {event}?",
    "cant make it to the {event} today, {excuse}", "omg the {event} was sooo good lol",
    "need the {doc} asap, can u {req}?", "btw i fixed the {thing} thing, no worries",
    "sry i missed ur call, was at the {event}", "hi, wanna grab {meal} after the {event}?",
]
FORMAL = [
    "We kindly request that all staff submit their {doc} by {day}.",
    "The {event} has been postponed until further notice due to {excuse2}.",
    "Please be advised that the {thing} will be unavailable on {day}.",
    "It is with great pleasure that we invite you to attend the {event}.",
    "Your application for the {doc} has been received and is currently under review.",
    "Kindly ensure that the {thing} is switched off before leaving the office.",
]
REWRITE = [
    "Turn this casual message into a formal one: {m}", "Make this message polite and "
    "professional:\n\n{m}", "Correct the spelling and grammar of this message: {m}",
    "Rewrite this message so that a manager could receive it: {m}",
]
REWRITE_FORMAL = [
    "Say this in a casual, friendly tone: {m}", "Simplify this sentence for a "
    "child: {m}", "Make this sentence shorter without losing its meaning: {m}",
    "Rewrite this sentence in the active voice, if it is not already: {m}",
]
TONE = {
    "req": ["forward the invoice", "call me back", "check the slides", "book the room",
            "bring the charger", "share the notes", "water the plants", "pick up the kids"],
    "event": ["meeting", "party", "game", "class", "concert", "workshop", "dinner", "trip"],
    "gift": ["flowers", "book", "cake", "tickets", "card", "ride"],
    "excuse": ["my car broke down", "im sick", "something came up", "my train is late"],
    "doc": ["report", "budget", "invoice", "timesheet", "slides", "contract", "permit"],
    "thing": ["printer", "wifi", "login", "website", "heating", "projector", "server"],
    "meal": ["lunch", "coffee", "pizza", "dinner", "ice cream"],
    "day": ["Friday", "Monday", "the end of the month", "noon tomorrow", "March 3"],
    "excuse2": ["unforeseen circumstances", "the weather", "low attendance", "maintenance work"],
}

# -- reading: short narrative paragraphs with questions -----------------------------------------
ITEMS = [("kettle", 18, 35), ("blanket", 12, 30), ("umbrella", 6, 20), ("lamp", 15, 40),
         ("mug", 4, 12), ("T-shirt", 8, 25), ("plant", 5, 18), ("book", 7, 20),
         ("candle", 3, 9), ("scarf", 10, 30), ("puzzle", 9, 22), ("towel", 6, 15)]
OCCASIONS = ["the new school year", "a birthday party", "her new flat", "a camping trip",
             "his new office", "a family holiday", "a housewarming gift"]
PLACE_KINDS = ["small fishing town", "mountain village", "river port", "university town",
               "island village", "market town"]
REGIONS = ["the north of the country", "a quiet valley", "the southern coast", "a large bay",
           "the edge of a national park", "the foothills of the mountains"]
FEATURES = ["old stone bridge", "lighthouse", "weekly farmers' market", "cheese", "bakeries",
            "hiking trails", "botanical garden", "wooden churches", "harbor", "music school",
            "olive groves", "hot springs", "castle ruins", "clock tower"]
SEASONS = ["spring", "summer", "autumn", "winter"]
FESTIVALS = ["a boat race", "a jazz festival", "a lantern parade", "a food fair",
             "a kite festival", "an open-air film week", "a marathon"]
ORGS = ["gardening club", "school", "youth orchestra", "volunteer fire brigade", "library",
        "chess club", "local bakery", "cycling club"]
EVENTS = ["charity run", "book sale", "concert", "cake sale", "clean-up day", "quiz night",
          "open day", "art exhibition"]
CAUSES = ["the children's hospital", "a new playground", "the animal shelter", "new library "
          "books", "flood relief", "a community garden"]
PLANS = ["hold it twice a year", "invite schools from nearby towns", "move it to a bigger hall",
         "add a second day", "start a monthly version"]
TRANSPORT = ["bus", "tram", "train", "ferry", "bike"]
JOBS = ["nurse", "baker", "teacher", "engineer", "librarian", "gardener", "pilot", "chef"]
READ_TASKS = [
    "Here is a short text:\n\n{p}\n\n{q}", "{q} Use this passage:\n\n{p}",
    "{p}\n\nBased on the text above: {q}",
    "Answer the question using only the paragraph below.\n\nParagraph: {p}\n\nQuestion: {q}",
]
SUMMARY_TASKS = [
    "Condense this paragraph into {k} sentences:\n\n{p}",
    "Summarize in one sentence:\n\n{p}", "Give this paragraph a short title:\n\n{p}",
    "List the facts in this text as bullet points:\n\n{p}",
    "Extract the people, places and numbers in this text as a JSON object:\n\n{p}",
    "Write three quiz questions about this paragraph, with answers:\n\n{p}",
    "Rewrite this paragraph for a young reader:\n\n{p}",
]

# -- reading code -----------------------------------------------------------------------------
CODE_READ_TASKS = [
    "What does the following Python snippet do?\n\n{c}",
    "What does this code print? Explain why.\n\n{c}",
    "Add helpful comments to this code:\n\n{c}", "Rewrite this code to be more readable:\n\n{c}",
    "Are there any bugs or edge cases in this code?\n\n{c}",
    "Translate this Python code into JavaScript:\n\n{c}",
    "What is the time complexity of this code?\n\n{c}",
    "Explain this code line by line to a beginner:\n\n{c}",
]
FUNCTION_TASKS = [
    "Explain what this Python function does:\n\n{c}", "Write two unit tests for this "
    "function:\n\n{c}", "Write a docstring for this function:\n\n{c}",
    "Suggest one improvement to this function and explain it:\n\n{c}",
    "Summarize what this function does in one sentence:\n\n{c}",
]
WORDS = ["banana", "python", "level", "keyboard", "rocket", "garden", "window", "planet"]

# -- everyday how-to and why questions --------------------------------------------------------
ACTIVITIES = [
    "learning to cook", "running a first marathon", "studying for an exam", "keeping houseplants "
    "alive", "writing a resume", "training a puppy", "saving for a holiday", "learning to draw",
    "starting a podcast", "working from home", "moving to a new city", "learning to swim",
    "keeping a journal", "preparing for a job interview", "organizing a small kitchen",
    "learning a musical instrument", "reading more books", "sleeping better", "hiking in the "
    "mountains", "taking care of a cat", "cycling to work", "making friends at a new school",
    "planning a birthday party", "learning to type faster", "cutting down on sugar",
    "keeping a budget", "teaching a child to read", "growing tomatoes on a balcony",
    "camping with children", "giving a presentation", "baking sourdough bread",
    "writing clean code", "reviewing a colleague's code", "learning touch typing",
    "caring for an aquarium", "traveling on a small budget", "staying focused while studying",
    "reducing food waste", "volunteering at a shelter", "recording music at home",
]
ACTIVITY_TASKS = [
    "Give me {n} tips for {a}.",
    "What are common mistakes people make when {a}?", "What should a beginner know before "
    "{a}?", "How can I get better at {a}?", "I am new to {a}. Where should I start?",
    "Make a one-week plan for {a}.",
]
PHENOMENA = [
    "ice floats on water", "leaves change color in autumn", "we have seasons", "bread rises",
    "the sea is salty", "we see lightning before we hear thunder", "the moon has phases",
    "metal feels colder than wood", "cats purr", "onions make people cry", "bubbles are round",
    "stars twinkle", "we get goosebumps", "planes can fly",
    "boats float", "yawning is contagious", "coffee keeps people awake", "popcorn pops",
    "our ears pop on airplanes", "ice cubes crack in a drink", "rubber bounces",
    "some animals hibernate", "the ocean has waves", "soap removes grease",
    "hot air balloons rise", "we need to sleep", "apples turn brown when cut",
    "a spoon looks bent in a glass of water", "birds fly south in winter",
]
WHY_TASKS = [
    "Why is it that {p}?", "Can you explain to a child why "
    "{p}?", "What is the science behind the fact that {p}?",
]
DEVICES = ["refrigerator", "microwave oven", "thermostat", "bicycle gear", "GPS receiver",
           "touch screen", "solar cell", "electric kettle", "vacuum cleaner", "smoke detector",
           "compass", "barcode scanner", "washing machine", "heat pump", "noise-cancelling "
           "headphone", "elevator", "search engine", "password manager", "credit card"]
DEVICE_TASKS = ["How does a {d} work?", "Explain how a {d} works in simple terms.",
                "What are the main parts of a {d}, and what does each do?"]

# -- multi-step word problems -----------------------------------------------------------------
STEP_SUFFIXES = ["Think step by step.", "Explain your reasoning.", "Write out each step.",
                 "Check your answer at the end.", ""]
MOVERS = [("car", 40, 110), ("bus", 30, 80), ("cyclist", 12, 30), ("boat", 10, 40),
          ("runner", 8, 15), ("truck", 50, 90)]
WORD_PROBLEMS = [
    "A {mover} covers {s1}0 km in {t1} hours and then {s2}0 km in {t2} hours. What is its "
    "average speed over the whole trip?",
    "{name} buys {n1} {item1}s at ${p1} each and {n2} {item2}s at ${p2} each, and pays with a "
    "${bill} bill. How much change does {name} get?",
    "A {item1} costs ${a}. Its price rises by {pct}% and then falls by {pct2}%. What is the "
    "final price?",
    "{name} is {age} years old. {name2} is {k} times as old as {name}. How old will {name2} be "
    "in {t1} years?",
    "{name} can paint a fence in {t1} hours, and {name2} can paint it in {t2} hours. How long "
    "does it take them working together?",
    "{name} scored {s1}, {s2} and {s3} on three tests. What score on the fourth test gives an "
    "average of {avg}?",
    "How many seconds are there in {t1} days?", "Convert {s1} km per hour into meters per second.",
    "A garden is {w} m wide and {l} m long, with a path {t2} m wide all around it. What is the "
    "area of the path?",
    "You deposit ${bill}0 at {pct2}% simple interest per year. How much do you have after {t1} "
    "years?", "Paint is mixed in the ratio {t1}:{t2}. How many liters of each color are needed "
    "for {l} liters?",
    "A class has {n1}0 students. {pct}% of them walk to school and the rest take the bus. How "
    "many take the bus?",
    "A water tank holds {a} liters. It leaks {n2} liters per hour and is refilled with {n1} "
    "liters every {t2} hours. How much water is left after {k}0 hours?",
    "{name} works {t1} hours a day, {n2} days a week, and earns ${p1}0 per hour. How much is "
    "that per week and per year?",
]

# -- structured output ------------------------------------------------------------------------
ENTITY_KEYS = {
    "book": ["title", "author", "year", "genre", "pages", "summary"],
    "movie": ["title", "director", "year", "genre", "rating", "main_actors"],
    "city": ["name", "country", "population", "landmarks", "best_season"],
    "recipe": ["name", "servings", "ingredients", "steps", "time_minutes"],
    "employee": ["name", "role", "department", "start_date", "skills"],
    "car": ["make", "model", "year", "fuel", "price"],
    "song": ["title", "artist", "album", "year", "duration_seconds"],
    "planet": ["name", "moons", "distance_from_sun", "type", "fun_fact"],
    "product": ["name", "price", "category", "in_stock", "tags"],
    "restaurant": ["name", "cuisine", "address", "rating", "opening_hours"],
    "event": ["name", "date", "location", "speakers", "tickets"],
    "country": ["name", "capital", "languages", "currency", "population"],
}
STRUCT_TASKS = [
    "Give me a JSON object for a {e}, using the fields {keys}.",
    "Create a JSON array of {n} {e}s, each with the keys {keys}.",
    "Write a CSV file with the columns {keys} and {n} example rows of {e}s.",
    "Make a Markdown table of {n} {e}s with the columns {keys}.",
    "Write a YAML document describing a {e} with the fields {keys}.",
]
CATEGORIES = [
    "vegetables that grow well in cold weather", "countries in South America", "animals that "
    "live in the Arctic", "famous painters", "programming languages", "musical instruments",
    "types of clouds", "board games", "sports played with a ball", "rivers in Europe",
    "kitchen tools", "breakfast foods", "birds that cannot fly", "inventions of the 20th century",
    "ways to save energy at home", "words that rhyme with 'light'", "capital cities in Asia",
    "desserts from France", "careers in science", "materials that conduct electricity",
    "things to pack for a beach trip", "famous bridges", "indoor hobbies", "herbs used in "
    "cooking", "gemstones", "dog breeds", "Olympic sports", "mammals that live in the sea",
    "classic novels", "types of renewable energy",
]
LIST_TASKS = ["Name {n} {c}.", "Give a comma-separated list of "
              "{n} {c}.", "List {n} {c} and give one fact about each.",
              "What are {n} examples of {c}? Answer as a numbered list."]

# -- stories and messages ---------------------------------------------------------------------
CHARACTERS = ["an old cat", "an old fisherman", "a shy robot", "a young baker", "a lost puppy",
              "a retired teacher", "a curious girl", "a lighthouse keeper", "a tired dragon",
              "two brothers", "a street musician", "a small turtle"]
PLOTS = ["learns to juggle", "finds a mysterious key", "makes a new friend", "gets lost in a big "
         "city", "wins a baking contest", "is afraid of the dark", "plants a tree",
         "discovers a hidden room", "travels to the moon", "helps a stranger", "forgets a "
         "birthday", "builds a boat"]
STORY_TASKS = [
    "Tell a {n}-sentence story about {c} who {p}.",
    "Write a children's story about {c} who {p}.", "Write a funny short story about {c} who "
    "{p}.", "Write the first paragraph of a story about {c} who {p}.",
    "Write a poem about {c} who {p}.",
]
RECIPIENTS = ["a neighbor", "a teacher", "a colleague", "a landlord", "a customer", "an old "
              "friend", "a manager", "a client", "a coach", "a new team member"]
PURPOSES = ["asking to borrow a lawn mower", "thanking them for their help",
            "apologizing for missing a meeting", "inviting them to a party",
            "asking for a deadline extension", "reporting a broken heater",
            "introducing yourself", "asking for a recommendation letter",
            "confirming an appointment on Tuesday", "declining an invitation politely",
            "following up on an unanswered question", "welcoming them to the team"]
MESSAGE_TASKS = ["Draft a warm email to {r} {p}.", "Write a short, polite message to {r} "
                 "{p}.", "Write a formal letter to {r} {p}.", "Write a text message to {r} "
                 "{p}."]

# == version 3: open-vocabulary requests over lexicon.py's words and example sentences ==========
# {x}: the word; {a}: the word with "a"/"an"; {y}, {b}: a second word of the same kind.
NOUN_TASKS = [
    "Write a short paragraph about {x}.", "Give me three interesting facts about {x}.",
    "What is {a}? Answer in a few sentences.", "Write a haiku about {x}.",
    "Write a four-line rhyming poem about {x}.",
    "List six words that come to mind when you think of {x}.",
    "Give a JSON object with the fields \"name\", \"category\" and \"description\" for {x}.",
    "Write a cheerful social media post about {x}.",
    "Make up a riddle whose answer is \"{x}\", then give the answer.",
    "Write a short dialogue between two friends talking about {x}.",
    "How would you explain \"{x}\" to a seven-year-old?",
    "Give two example sentences that use the word \"{x}\".",
    "Write a very short story in which {a} plays an important part.",
    "Tell me about {x} in three bullet points.",
    "What are some common misconceptions about {x}?",
    "Write a limerick about {x}.",
]
PAIR_TASKS = ["What is the difference between {a} and {b}?", "Compare {x} and {y} in a short "
              "table.", "Which is more useful, {a} or {b}? Give reasons.",
              "Write a short story that involves both {a} and {b}.",
              "How are {x} and {y} alike, and how are they different?"]
NOUN_KIND_TASKS = {
    "food": ["How is {x} usually eaten?", "Suggest a simple recipe that uses {x}.",
             "Is {x} good for you? Give a balanced answer.", "Where does {x} come from?"],
    "animal": ["Where does the {x} live, and what does it eat?",
               "Tell me some fun facts about the {x}.", "How does the {x} raise its young?"],
    "plant": ["How do you grow {x} at home?", "Describe what {x} looks like.",
              "What is {x} used for?"],
    "artifact": ["How does {a} work?", "What is {a} used for?",
                 "Write a short product description for {a}.",
                 "How should you look after {a} so that it lasts?",
                 "Who invented the {x}, and why was it useful?"],
    "person": ["What does {a} do on a typical day?", "What skills does {a} need?",
               "Write a job advertisement for {a}.", "Write a short story about {a} who {p}."],
    "location": ["What is {x} known for?", "Plan a relaxed one-day visit to {x}.",
                 "Describe {x} to someone who has never been there."],
    "body": ["What does the {x} do in the human body?", "How can I keep my {x} healthy?"],
    "phenomenon": ["Why does {x} happen?", "What causes {x}? Explain it simply."],
    "process": ["Explain how {x} works, step by step.", "Why is {x} important?"],
    "event": ["Describe {a} from start to finish.", "Why do people remember {x}?"],
    "substance": ["What is {x} made of, and what is it used for?", "Is {x} dangerous? Explain.",
                  "Where is {x} found?"],
}
ABSTRACT_TASKS = ["What does \"{x}\" mean? Give an everyday example.",
                  "Explain the idea of {x} with a simple example.",
                  "Why does {x} matter in daily life?", "Write a short poem about {x}.",
                  "Write a motivational paragraph about {x}."]
VERB_TASKS = ["How can I learn to {v}?", "Explain what it means to {v}, with two example "
              "sentences.", "Write a short story in which someone has to {v}.",
              "Give three tips for anyone who needs to {v}.", "Write a short poem about the "
              "urge to {v}.", "What is the opposite of \"to {v}\"? Explain with examples.",
              "Describe a situation where it would be a bad idea to {v}."]
SENTENCE_TASKS = ["Translate this sentence into {lang}:\n\n{s}", "Put this into {lang}: {s}",
                  "Make this sentence sound more formal: {s}",
                  "Rewrite this sentence for a young child: {s}",
                  "Paraphrase the following sentence: {s}",
                  "Is this sentence grammatically correct? Explain.\n\n{s}",
                  "Continue this text with two more sentences: {s}",
                  "What does this sentence mean? \"{s}\"", "Turn this sentence into a question: {s}",
                  "Write a short story that begins with: \"{s}\"",
                  "List the nouns and the verbs in this sentence: {s}",
                  "Explain the meaning of this sentence in simple words: {s}",
                  "Write a reply to someone who just said: \"{s}\""]
SENTENCES_TASKS = ["Summarize these sentences in one sentence:\n\n{ss}",
                   "Which of these sentences is the most formal, and why?\n\n{ss}",
                   "Number these sentences and give each a one-word topic:\n\n{ss}",
                   "Write a paragraph that connects these sentences:\n\n{ss}"]

# == version 4: version 2's kinds of request over lexicon.py's vocabulary ======================
# Coding tasks about a concrete noun, for pool.CODE_VERBS' {task}: {x} the noun, {a} with its
# article, {ident} as an identifier, {k} and {n} seeded numbers. No plurals: "{x} records".
CODE_NOUN_TASKS = [
    "keeps an inventory of {x} items in a dictionary, with functions to add and remove them",
    "sorts a list of {x} records by their price and then by their name",
    "finds the {x} with the highest rating in a list of dictionaries",
    "reads a CSV file of {x} records and prints how many there are of each color",
    "validates a `{ident}` dictionary: it needs a non-empty name and a positive quantity",
    "groups a list of {x} records by category and counts each group",
    "counts how often the word \"{x}\" appears in a text, ignoring case",
    "returns the {k} cheapest {x} records from a list",
    "converts a list of {x} records to JSON and back",
    "models {a} as a class with a name, a size and a method that describes it",
    "stores {x} records in a SQLite table and returns those added in the last {n} days",
    "simulates a queue of people waiting for {a}, serving one every {k} minutes",
    "filters out every {x} record whose quantity is below {k}",
    "merges two lists of {x} records, keeping the newer record for each id",
    "prints a text report of {x} records as an aligned table",
    "picks a random {x} from a weighted list of {n} options",
]
# The fields of a structured record for a noun of each of lexicon.py's concrete kinds.
KIND_KEYS = {
    "animal": ["name", "habitat", "diet", "lifespan_years", "size", "fun_fact"],
    "artifact": ["name", "material", "size", "price", "main_use", "invented"],
    "body": ["name", "location", "function", "size", "related_organs"],
    "food": ["name", "origin", "calories", "main_ingredients", "taste", "serving"],
    "object": ["name", "where_found", "size", "made_of", "notable_fact"],
    "person": ["title", "duties", "skills", "workplace", "typical_hours", "training"],
    "plant": ["name", "climate", "height", "uses", "flowering_season", "care_tips"],
    "substance": ["name", "state", "color", "uses", "hazards", "where_found"],
}
# Categories made from a noun for version 2's LIST_TASKS ({c}).
CATEGORY_FORMS = ["kinds of {x}", "things you can do with {a}", "words related to {x}",
                  "surprising facts about {a}", "uses of {a}", "places where you might see {a}",
                  "questions a child might ask about {a}"]
