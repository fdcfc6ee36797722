#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/plan/strategy.h"

using namespace hp::plan;

namespace {

std::string parse_error(const std::string& text) {
  try {
    parse_strategy(text);
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "no error";
}

std::string resolve_error(const std::string& text, const std::string& model, int64_t devices) {
  try {
    resolve_strategy(parse_strategy(text), model_preset(model), devices);
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "no error";
}

bool mentions(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST(Strategy, ParsesEveryKey) {
  Strategy s = parse_strategy("dp=8, tp=8,pp=6,cp=1,ep=1,mb=16,fsdp=1,recompute=full,schedule=1f1b");
  EXPECT_EQ(s.dp, 8);
  EXPECT_EQ(s.tp, 8);
  EXPECT_EQ(s.pp, 6);
  EXPECT_EQ(s.microbatches, 16);
  EXPECT_TRUE(s.fsdp());
  EXPECT_EQ(s.zero, 3);
  EXPECT_EQ(s.recompute, Recompute::Full);
  EXPECT_EQ(s.schedule, "1f1b");
  Strategy i = parse_strategy("pp=4,schedule=interleaved-1f1b,mbs=2,gbs=64,recompute=selective");
  EXPECT_EQ(i.virtual_stages, 2);  // interleaving defaults to two chunks
  EXPECT_EQ(i.micro_batch, 2);
  EXPECT_EQ(i.global_batch, 64);
  EXPECT_EQ(parse_strategy("pp=4,schedule=interleaved-1f1b,vpp=4").virtual_stages, 4);
  EXPECT_EQ(parse_strategy("pp=4,schedule=dualpipev").virtual_stages, 2);  // the V
  const Strategy c = parse_strategy("dp=2,recompute=full_chunked");
  EXPECT_EQ(c.recompute, Recompute::FullChunked);
  EXPECT_EQ(parse_strategy(to_string(c)).recompute, Recompute::FullChunked);
}

TEST(Strategy, ParseErrorsNameTheKeyOrValue) {
  EXPECT_TRUE(mentions(parse_error("dp=8,foo=2"), "unknown key 'foo'"));
  EXPECT_TRUE(mentions(parse_error("tp=x"), "tp=x"));
  EXPECT_TRUE(mentions(parse_error("tp=0"), "tp=0"));
  EXPECT_TRUE(mentions(parse_error("tp=2.5"), "tp=2.5"));
  EXPECT_TRUE(mentions(parse_error("tp"), "expected key=value"));
  EXPECT_TRUE(mentions(parse_error("tp=2,tp=4"), "given twice"));
  EXPECT_TRUE(mentions(parse_error("fsdp=maybe"), "fsdp=maybe"));
  EXPECT_TRUE(mentions(parse_error("zero=4"), "zero=4"));
  EXPECT_TRUE(mentions(parse_error("zero=1,fsdp=1"), "not both"));
  EXPECT_TRUE(mentions(parse_error("recompute=some"), "recompute=some"));
  EXPECT_TRUE(mentions(parse_error("schedule=magic"), "zbv"));
}

TEST(Strategy, ValidityChecksSayExpectedAndFound) {
  EXPECT_TRUE(mentions(resolve_error("dp=2,tp=2", "llama3-8b", 8), "dp*tp*pp*cp*ep == 8"));
  EXPECT_TRUE(mentions(resolve_error("dp=1,tp=3,pp=1", "llama3-8b", 3), "heads % tp"));
  EXPECT_TRUE(mentions(resolve_error("dp=4,ep=2", "llama3-8b", 8), "dense model"));
  EXPECT_TRUE(mentions(resolve_error("tp=1,pp=5", "tiny", 5), "pp * vpp <= layers"));
  EXPECT_TRUE(mentions(resolve_error("dp=1,pp=4,mb=6,schedule=interleaved-1f1b,vpp=2", "llama3-8b", 4),
                       "mb % pp"));
  EXPECT_TRUE(mentions(resolve_error("dp=1,pp=4,schedule=zbv,vpp=3", "llama3-8b", 4), "vpp == 2"));
  EXPECT_TRUE(mentions(resolve_error("dp=1,pp=4,mb=6,schedule=dualpipev", "llama3-8b", 4), "mb >= 2*pp"));
  EXPECT_TRUE(mentions(resolve_error("dp=1,pp=2,vpp=2", "llama3-8b", 2), "1f1b expects vpp == 1"));
  EXPECT_TRUE(mentions(resolve_error("dp=3,gbs=64", "tiny", 3), "gbs % (dp*ep)"));
  EXPECT_TRUE(mentions(resolve_error("cp=3", "tiny", 3), "seq_len % cp"));
  EXPECT_TRUE(mentions(resolve_error("tp=1,ep=3", "deepseek-v3-like", 3), "experts % ep"));
  // full_chunked chunks dense layers' MLPs: a model of MoE layers alone has none.
  ModelDesc all_moe = model_preset("deepseek-v3-like");
  all_moe.dense_layers = 0;
  EXPECT_NO_THROW(resolve_strategy(parse_strategy("ep=2,recompute=full"), all_moe, 2));
  try {
    resolve_strategy(parse_strategy("ep=2,recompute=full_chunked"), all_moe, 2);
    ADD_FAILURE() << "full_chunked on a model without dense layers";
  } catch (const hp::Error& e) {
    EXPECT_TRUE(mentions(e.what(), "every layer of this model is MoE")) << e.what();
  }

}

TEST(Strategy, DerivesDpAndBatch) {
  Strategy s = resolve_strategy(parse_strategy("tp=2,pp=2,mb=8"), model_preset("tiny"), 8);
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.micro_batch, 1);
  EXPECT_EQ(s.global_batch, 16);
  Strategy g = resolve_strategy(parse_strategy("dp=4,gbs=64,mbs=2"), model_preset("tiny"), 4);
  EXPECT_EQ(g.microbatches, 8);
  Strategy e = resolve_strategy(parse_strategy("dp=2,tp=8,pp=4,ep=8,gbs=256"), model_preset("deepseek-v3-like"), 512);
  EXPECT_EQ(e.data_replicas(), 16);
  EXPECT_EQ(e.microbatches, 16);
}

TEST(Strategy, TextRoundTrips) {
  Strategy s = resolve_strategy(parse_strategy("dp=2,tp=2,pp=2,mb=4,fsdp=on,recompute=selective,schedule=zb-h1"),
                                model_preset("tiny"), 8);
  Strategy back = parse_strategy(to_string(s));
  EXPECT_EQ(to_string(back), to_string(s));
}

TEST(Strategy, CpModeRoundTripsAndIsChecked) {
  Strategy s = parse_strategy("cp=4,cp_mode=hybrid,cp_ulysses=2");
  EXPECT_EQ(s.cp_mode, "hybrid");
  EXPECT_EQ(s.cp_ulysses, 2);
  Strategy back = parse_strategy(to_string(s));
  EXPECT_EQ(back.cp_mode, "hybrid");
  EXPECT_EQ(back.cp_ulysses, 2);
  EXPECT_EQ(parse_strategy("cp=2").cp_mode, "ring");  // the trainer's default
  EXPECT_TRUE(mentions(parse_error("cp_mode=rign"), "cp_mode=rign"));
  EXPECT_TRUE(mentions(resolve_error("cp=4,cp_mode=hybrid,cp_ulysses=3", "llama3-8b", 4), "cp_ulysses to divide cp"));
  EXPECT_TRUE(mentions(resolve_error("cp=4,cp_mode=hybrid", "llama3-8b", 4), "cp_ulysses to divide cp"));
  EXPECT_TRUE(mentions(resolve_error("cp=2,cp_ulysses=2", "llama3-8b", 2), "cp_ulysses == 1 outside"));
  EXPECT_TRUE(mentions(resolve_error("tp=2,cp=4,cp_mode=ulysses", "tiny", 8), "(heads / tp) % cp == 0"));
}
