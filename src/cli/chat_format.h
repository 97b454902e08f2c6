/* The Qwen3 chat format: <|im_start|>role\n...<|im_end|>\n, the assistant
 * turn opened with an empty <think> block when thinking is off. */
#ifndef Q3_CHAT_FORMAT_H
#define Q3_CHAT_FORMAT_H

/* Heap string for one user turn (with an optional system message first,
 * only on the first turn), ending with the opened assistant turn. */
char *chat_format_turn(const char *system, const char *user, int think);
/* Per-turn soft switch: "/no_think" in the message turns thinking off,
 * "/think" on, each as a word of its own (not inside a word, a path or
 * </think>); otherwise `dflt`. */
int chat_wants_think(const char *user, int dflt);
/* What an earlier answer is in the history, as Qwen3's template renders a
 * past assistant turn: the text after its last </think>, leading newlines
 * dropped; the whole answer when it has none. Points into `answer`. */
const char *chat_answer_content(const char *answer);

#endif
