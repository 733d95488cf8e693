"""The fact tables mc_task.py asks about: everyday facts a 135M instruct model mostly knows (capitals, opposites,
plurals, past tenses, animal young and sounds, colours of common things) and the ordered lists its generated
families count along (weekdays, months, letters). Each table maps the word a question names to its answer;
the table's other answers are the distractors (two words may share an answer: the distractors exclude it)."""

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon", "Japan": "Tokyo",
    "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "Greece": "Athens", "Canada": "Ottawa",
    "Australia": "Canberra", "India": "New Delhi", "Brazil": "Brasilia", "Argentina": "Buenos Aires",
    "Mexico": "Mexico City", "Kenya": "Nairobi", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Poland": "Warsaw", "Austria": "Vienna", "Ireland": "Dublin",
    "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Switzerland": "Bern", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "South Korea": "Seoul", "Peru": "Lima", "Chile": "Santiago",
    "Colombia": "Bogota", "Cuba": "Havana", "Hungary": "Budapest", "the Czech Republic": "Prague", "Ukraine": "Kyiv",
    "England": "London", "Scotland": "Edinburgh", "the United States": "Washington", "Indonesia": "Jakarta",
    "the Philippines": "Manila", "Malaysia": "Kuala Lumpur", "Pakistan": "Islamabad", "Saudi Arabia": "Riyadh",
    "Israel": "Jerusalem", "Lebanon": "Beirut", "Syria": "Damascus", "Jordan": "Amman", "Morocco": "Rabat",
    "Nigeria": "Abuja", "Ethiopia": "Addis Ababa", "Ghana": "Accra", "Venezuela": "Caracas", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Iceland": "Reykjavik", "Nepal": "Kathmandu",
    "Afghanistan": "Kabul", "New Zealand": "Wellington", "Uruguay": "Montevideo", "Estonia": "Tallinn",
    "Latvia": "Riga", "Lithuania": "Vilnius", "Slovakia": "Bratislava",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad", "light": "dark", "old": "young",
    "early": "late", "open": "closed", "full": "empty", "rich": "poor", "hard": "soft", "high": "low", "wet": "dry",
    "strong": "weak", "long": "short", "thick": "thin", "loud": "quiet", "clean": "dirty", "win": "lose",
    "buy": "sell", "push": "pull", "first": "last", "day": "night", "true": "false", "good": "bad",
    "inside": "outside", "left": "right", "before": "after", "always": "never",
    "north": "south", "east": "west", "black": "white", "top": "bottom", "heavy": "light",
    "wide": "narrow", "deep": "shallow", "sweet": "sour", "love": "hate", "laugh": "cry", "begin": "end",
    "come": "go", "give": "take", "friend": "enemy", "war": "peace", "alive": "dead", "safe": "dangerous",
    "near": "far", "cheap": "expensive", "easy": "difficult", "question": "answer", "remember": "forget",
    "smooth": "rough", "sharp": "blunt", "tall": "short", "male": "female", "summer": "winter",
    "accept": "refuse", "entrance": "exit", "asleep": "awake", "increase": "decrease", "float": "sink",
}
PLURALS = {
    "mouse": "mice", "child": "children", "man": "men", "woman": "women", "foot": "feet", "tooth": "teeth",
    "goose": "geese", "person": "people", "ox": "oxen", "cactus": "cacti", "knife": "knives", "wife": "wives",
    "leaf": "leaves", "wolf": "wolves", "half": "halves", "loaf": "loaves", "shelf": "shelves", "calf": "calves",
    "box": "boxes", "fox": "foxes", "bus": "buses", "church": "churches", "dish": "dishes", "glass": "glasses",
    "baby": "babies", "city": "cities", "lady": "ladies", "party": "parties", "story": "stories",
    "country": "countries", "potato": "potatoes", "tomato": "tomatoes", "hero": "heroes", "cat": "cats",
    "dog": "dogs", "book": "books", "car": "cars", "tree": "trees", "house": "houses", "apple": "apples",
    "chair": "chairs", "bird": "birds", "boy": "boys", "girl": "girls", "key": "keys", "toy": "toys",
    "day": "days", "watch": "watches", "brush": "brushes", "wish": "wishes", "class": "classes", "kiss": "kisses",
    "life": "lives", "thief": "thieves", "louse": "lice", "crisis": "crises",
    "family": "families", "flower": "flowers", "window": "windows",
}
PAST_TENSES = {
    "go": "went", "see": "saw", "eat": "ate", "take": "took", "give": "gave", "come": "came", "run": "ran",
    "write": "wrote", "speak": "spoke", "drink": "drank", "sing": "sang", "swim": "swam", "begin": "began",
    "drive": "drove", "ride": "rode", "fly": "flew", "know": "knew", "grow": "grew", "throw": "threw",
    "draw": "drew", "break": "broke", "choose": "chose", "forget": "forgot", "get": "got", "buy": "bought",
    "bring": "brought", "think": "thought", "teach": "taught", "catch": "caught", "fight": "fought",
    "sell": "sold", "tell": "told", "find": "found", "make": "made", "say": "said", "pay": "paid", "keep": "kept",
    "sleep": "slept", "feel": "felt", "leave": "left", "meet": "met", "sit": "sat", "stand": "stood",
    "understand": "understood", "win": "won", "lose": "lost", "build": "built", "send": "sent", "spend": "spent",
    "hold": "held", "walk": "walked", "play": "played", "jump": "jumped", "talk": "talked", "cook": "cooked",
    "open": "opened", "watch": "watched", "help": "helped", "laugh": "laughed", "dance": "danced",
    "fall": "fell", "wear": "wore", "hear": "heard", "become": "became",
}
YOUNG = {
    "cat": "kitten", "dog": "puppy", "cow": "calf", "sheep": "lamb", "horse": "foal", "goat": "kid",
    "duck": "duckling", "frog": "tadpole", "bear": "cub", "kangaroo": "joey", "goose": "gosling", "pig": "piglet",
    "swan": "cygnet", "owl": "owlet", "chicken": "chick", "deer": "fawn", "butterfly": "caterpillar",
    "eagle": "eaglet", "hare": "leveret", "seal": "pup",
}
SOUNDS = {
    "dog": "barks", "cat": "meows", "cow": "moos", "lion": "roars", "snake": "hisses", "horse": "neighs",
    "duck": "quacks", "pig": "oinks", "sheep": "bleats", "owl": "hoots", "bee": "buzzes", "frog": "croaks",
    "mouse": "squeaks", "wolf": "howls", "rooster": "crows", "donkey": "brays", "bird": "chirps",
    "turkey": "gobbles", "elephant": "trumpets", "pigeon": "coos",
}
COLOURS = {
    "a banana": "yellow", "grass": "green", "the sky on a clear day": "blue", "snow": "white", "coal": "black",
    "a ripe tomato": "red", "an orange": "orange", "a lemon": "yellow", "milk": "white", "a strawberry": "red",
    "a leaf in summer": "green", "the sea": "blue", "chocolate": "brown", "a carrot": "orange",
    "an eggplant": "purple", "a lime": "green", "blood": "red", "a crow": "black", "a polar bear": "white",
    "a pumpkin": "orange", "a fire truck": "red", "tree bark": "brown", "a flamingo": "pink", "a cloud": "white",
    "a blueberry": "blue", "the night sky": "black", "a frog": "green", "an elephant": "grey", "gold": "yellow",
    "a grape": "purple",
}
# The colours a colour question's three distractors come from (COLOURS repeats its answers, so it cannot be its own
# pool).
COLOUR_NAMES = ["red", "green", "blue", "yellow", "white", "black", "orange", "purple", "brown", "pink", "grey"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
LETTERS = [chr(code) for code in range(ord("A"), ord("Z") + 1)]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
