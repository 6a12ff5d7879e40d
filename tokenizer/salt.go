package tokenizer

import "github.com/valyala/fastjson"

// cacheSalt reads cache_salt as vLLM's check_cache_salt_support validates
// it: absent or null is none; anything else must be a non-empty string
// (the engine refuses the request otherwise). SGLang's protocol types
// admit a list (Optional[Union[List[str], str]], python/sglang/srt/
// entrypoints/openai/protocol.py), but its OpenAI server refuses a
// non-empty one (serving_base.py _compute_extra_key raises "Value of
// cache_salt must be a string"; c5695a4be1c4f84791eeaceeb6e4a775f8e7d0cc)
// and ignores an empty one, which vLLM refuses: a list is refused here,
// naming both.
func cacheSalt(o *fastjson.Object) (string, error) {
	v := present(o.Get("cache_salt"))
	if v == nil {
		return "", nil
	}
	if v.Type() == fastjson.TypeArray {
		return "", &BodyError{ReasonBadField, "cache_salt: must be a non-empty string if provided, not a list (SGLang's OpenAI server refuses a list too, and vLLM any non-string)"}
	}
	if v.Type() != fastjson.TypeString || len(v.GetStringBytes()) == 0 {
		return "", &BodyError{ReasonBadField, "cache_salt: must be a non-empty string if provided"}
	}
	return str(v), nil
}

// extraKey reads SGLang's extra_key: "" when absent or falsy in Python
// ("" , [], null, false, 0), the string, or another value's JSON.
func extraKey(o *fastjson.Object) string {
	v := present(o.Get("extra_key"))
	if v == nil {
		return ""
	}
	switch v.Type() {
	case fastjson.TypeString:
		return str(v)
	case fastjson.TypeArray:
		if a, _ := v.Array(); len(a) == 0 {
			return ""
		}
	case fastjson.TypeFalse:
		return ""
	case fastjson.TypeNumber:
		if v.GetFloat64() == 0 {
			return ""
		}
	case fastjson.TypeObject:
		if ob, _ := v.Object(); ob.Len() == 0 {
			return ""
		}
	}
	return string(v.MarshalTo(nil))
}
